"""python-qpid-proton and Python's ssl module (OpenSSL) against the connector's TLS listener.
Usage: tls.py SCENARIO PORT CA [CERT KEY] [more]. Prints PASS SCENARIO.

  proton      send and receive through amqps:// (with CERT KEY: as an mTLS client)
  header      the AMQP protocol header is read and answered inside TLS (TLS-5)
  tls12       a client limited to TLS 1.2 gets through the handshake (TLS-2)
  tls11       a client limited to TLS 1.1 is refused (TLS-2)
  refused     the server ends the connection during or right after the handshake: no AMQP
              header comes back (mtls without a certificate, or with CERT KEY the server does
              not accept)
  untrusted   a client trusting only CA (not the server's issuer) refuses the server
  serial      N: the server presents the certificate with serial N
  rotation    OLD NEW: a connection made now sees certificate serial OLD; after a line on
              stdin (the test rotates the files) a new one sees NEW, and the first connection,
              still open, keeps working"""
import socket
import ssl
import sys

from proton import Message, SSLDomain
from proton.utils import BlockingConnection

TIMEOUT = 10
HOST = "127.0.0.1"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def context(ca, cert=None, key=None, version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    if version is not None:
        # OpenSSL refuses TLS 1.1 at its default security level; the test needs it offered.
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = version
        ctx.maximum_version = version
    return ctx


def tls_socket(port, ctx):
    raw = socket.create_connection((HOST, port), timeout=TIMEOUT)
    return ctx.wrap_socket(raw, server_hostname=HOST)


def header_answer(s):
    """Sends the SASL protocol header and returns what comes back first (b'' at end of stream)."""
    s.sendall(SASL_HEADER)
    got = b""
    while len(got) < 8:
        chunk = s.recv(8 - len(got))
        if not chunk:
            break
        got += chunk
    return got


def domain(ca, cert=None, key=None):
    d = SSLDomain(SSLDomain.MODE_CLIENT)
    d.set_trusted_ca_db(ca)
    d.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, ca)
    if cert:
        d.set_credentials(cert, key, None)
    return d


def connection(port, ca, cert=None, key=None, name="tls"):
    return BlockingConnection(
        "amqps://%s:%d" % (HOST, port),
        timeout=TIMEOUT,
        ssl_domain=domain(ca, cert, key),
        container_id=name,
        allowed_mechs="ANONYMOUS PLAIN",
    )


def send_receive(c, queue, bodies):
    s = c.create_sender("queues/" + queue)
    for b in bodies:
        s.send(Message(body=b))
    r = c.create_receiver("queues/" + queue, credit=len(bodies))
    got = []
    for _ in bodies:
        got.append(r.receive(timeout=TIMEOUT).body)
        r.accept()
    s.close()
    r.close()
    check(got == bodies, "received %r, sent %r" % (got, bodies))


def proton(port, ca, cert=None, key=None):
    c = connection(port, ca, cert, key)
    send_receive(c, "tls-proton", ["over tls %d" % i for i in range(5)])
    c.close()


def header(port, ca, cert=None, key=None):
    s = tls_socket(port, context(ca, cert, key))
    check(s.version() in ("TLSv1.2", "TLSv1.3"), "negotiated %s" % s.version())
    check(header_answer(s) == SASL_HEADER, "the SASL header is echoed inside TLS")
    s.close()


def tls12(port, ca, cert=None, key=None):
    s = tls_socket(port, context(ca, cert, key, ssl.TLSVersion.TLSv1_2))
    check(s.version() == "TLSv1.2", "negotiated %s" % s.version())
    check(header_answer(s) == SASL_HEADER, "AMQP over TLS 1.2")
    s.close()


def tls11(port, ca, cert=None, key=None):
    try:
        s = tls_socket(port, context(ca, cert, key, ssl.TLSVersion.TLSv1_1))
    except (ssl.SSLError, ConnectionResetError) as e:
        print("refused: %s" % e)
        return
    raise AssertionError("a TLS 1.1 handshake succeeded: %s" % s.version())


def refused(port, ca, cert=None, key=None):
    try:
        s = tls_socket(port, context(ca, cert, key))
        # With TLS 1.3 the server judges the client's certificate after the client's side of
        # the handshake is done: the refusal arrives on the first read.
        got = header_answer(s)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        print("refused: %s" % e)
        return
    check(got == b"", "the server answered %r to a client it should refuse" % got)


def untrusted(port, ca, cert=None, key=None):
    try:
        tls_socket(port, context(ca, cert, key))
    except ssl.SSLCertVerificationError as e:
        print("refused: %s" % e)
        return
    raise AssertionError("a server certificate from another CA was trusted")


def serial(port, ctx):
    s = tls_socket(port, ctx)
    n = int(s.getpeercert()["serialNumber"], 16)
    s.close()
    return n


def serial_is(port, ca, n):
    got = serial(port, context(ca))
    check(got == int(n), "serial %d, expected %s" % (got, n))


def rotation(port, ca, old, new):
    c = connection(port, ca, name="before-rotation")
    send_receive(c, "tls-rotation", ["before"])
    got = serial(port, context(ca))
    check(got == int(old), "serial %d before the rotation, expected %s" % (got, old))
    print("ROTATE", flush=True)
    sys.stdin.readline()
    got = serial(port, context(ca))
    check(got == int(new), "serial %d after the rotation, expected %s" % (got, new))
    send_receive(c, "tls-rotation", ["after, on the connection made before"])
    c.close()
    c = connection(port, ca, name="after-rotation")
    send_receive(c, "tls-rotation", ["after, on a new connection"])
    c.close()


if __name__ == "__main__":
    scenario, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rest = sys.argv[4:]
    {
        "proton": proton,
        "header": header,
        "tls12": tls12,
        "tls11": tls11,
        "refused": refused,
        "untrusted": untrusted,
        "rotation": rotation,
        "serial": serial_is,
    }[scenario](port, ca, *rest)
    print("PASS " + scenario)
