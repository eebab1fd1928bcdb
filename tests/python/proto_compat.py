"""Wire compatibility of proto/kubemq.proto with KubeMQ's own schema, as shipped in the PyPI
`kubemq` wheel (kubemq/grpc/kubemq_pb2.py). Every message, field (name, number, type, label,
type name), enum value and RPC (path, request, response, streaming) the wheel has must be in ours,
identical. Usage: proto_compat.py OUR_DESCRIPTOR_SET. Prints PASS."""
import sys

from google.protobuf import descriptor_pb2
from kubemq.grpc import kubemq_pb2

theirs = descriptor_pb2.FileDescriptorProto()
kubemq_pb2.DESCRIPTOR.CopyToProto(theirs)
fds = descriptor_pb2.FileDescriptorSet()
with open(sys.argv[1], "rb") as f:
    fds.ParseFromString(f.read())
ours = next(f for f in fds.file if f.package == "kubemq")

problems = []
if theirs.package != ours.package:
    problems.append("package %s != %s" % (theirs.package, ours.package))


def messages(fd):
    out = {}

    def walk(prefix, msgs):
        for m in msgs:
            name = prefix + m.name
            out[name] = m
            walk(name + ".", m.nested_type)

    walk("", fd.message_type)
    return out


def enums(fd):
    out = {e.name: e for e in fd.enum_type}
    for name, m in messages(fd).items():
        for e in m.enum_type:
            out[name + "." + e.name] = e
    return out


our_msgs = messages(ours)
for name, m in messages(theirs).items():
    o = our_msgs.get(name)
    if o is None:
        problems.append("message %s missing" % name)
        continue
    of = {f.number: f for f in o.field}
    for f in m.field:
        g = of.get(f.number)
        if g is None:
            problems.append("%s.%s (#%d) missing" % (name, f.name, f.number))
            continue
        for attr in ("name", "type", "label", "type_name"):
            if getattr(f, attr) != getattr(g, attr):
                problems.append("%s #%d %s: theirs %r, ours %r" % (name, f.number, attr, getattr(f, attr), getattr(g, attr)))

our_enums = enums(ours)
for name, e in enums(theirs).items():
    o = our_enums.get(name)
    if o is None:
        problems.append("enum %s missing" % name)
        continue
    ov = {v.name: v.number for v in o.value}
    for v in e.value:
        if ov.get(v.name) != v.number:
            problems.append("enum %s.%s: theirs %d, ours %r" % (name, v.name, v.number, ov.get(v.name)))

if [s.name for s in theirs.service] != [s.name for s in ours.service]:
    problems.append("services: theirs %s, ours %s" % ([s.name for s in theirs.service], [s.name for s in ours.service]))
our_methods = {m.name: m for s in ours.service for m in s.method}
for s in theirs.service:
    for m in s.method:
        o = our_methods.get(m.name)
        if o is None:
            problems.append("rpc %s missing" % m.name)
            continue
        for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
            if getattr(m, attr) != getattr(o, attr):
                problems.append("rpc %s %s: theirs %r, ours %r" % (m.name, attr, getattr(m, attr), getattr(o, attr)))

if problems:
    print("\n".join(problems))
    sys.exit(1)
print("compared %d messages, %d enums, %d rpcs" % (len(messages(theirs)), len(enums(theirs)), sum(len(s.method) for s in theirs.service)))
print("PASS proto_compat")
