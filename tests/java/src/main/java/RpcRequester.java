import javax.jms.Connection;
import javax.jms.JMSException;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Queue;
import javax.jms.Session;
import javax.jms.TemporaryQueue;
import javax.jms.TextMessage;

import org.apache.qpid.jms.JmsConnectionFactory;

/**
 * The requester of the RPC pair protocol (tests/python/rpc.py) with Qpid JMS, the JMS way: a
 * {@code TemporaryQueue} as JMSReplyTo and an anonymous producer (which Qpid JMS uses only when
 * the server offers ANONYMOUS-RELAY): {@code java RpcRequester URL CHANNEL}. Replies are
 * correlated by JMSCorrelationID = the request's JMSMessageID. Prints "PASS request".
 */
public final class RpcRequester {
    private static final long TIMEOUT_MS = 10_000;
    private static final String EXECUTED = "x-opt-kubemq-executed";
    private static final String ERROR = "x-opt-kubemq-error";

    private RpcRequester() {}

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    /** Sends {@code body} to {@code to} and returns its reply. */
    private static Message ask(Session s, MessageProducer anonymous, Queue to, TemporaryQueue replyTo,
            MessageConsumer replies, String body) throws JMSException {
        TextMessage m = s.createTextMessage(body);
        m.setJMSReplyTo(replyTo);
        anonymous.send(to, m);
        Message reply = replies.receive(TIMEOUT_MS);
        check(reply != null, "a reply to " + body);
        check(m.getJMSMessageID().equals(reply.getJMSCorrelationID()),
                "RPC-6: correlated by the request's message-id: sent " + m.getJMSMessageID()
                        + ", got " + reply.getJMSCorrelationID());
        return reply;
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        String channel = args[1];
        // The reply properties' names (x-opt-kubemq-...) are not JMS identifiers; Qpid JMS reads
        // them with its name validation off.
        String options = (url.contains("?") ? "&" : "?") + "jms.validatePropertyNames=false";
        try (Connection c = new JmsConnectionFactory(url + options).createConnection()) {
            c.start();
            Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE);
            TemporaryQueue replyTo = s.createTemporaryQueue();
            check(replyTo.getQueueName().startsWith("_amqp10.tmp."), replyTo.getQueueName());
            MessageConsumer replies = s.createConsumer(replyTo);
            MessageProducer anonymous = s.createProducer(null);
            Queue commands = s.createQueue("commands/" + channel);
            Queue queries = s.createQueue("queries/" + channel);
            Message r = ask(s, anonymous, commands, replyTo, replies, "reboot");
            check(Boolean.TRUE.equals(r.getObjectProperty(EXECUTED)), "RPC-7: executed");
            r = ask(s, anonymous, commands, replyTo, replies, "fail");
            check(Boolean.FALSE.equals(r.getObjectProperty(EXECUTED)), "RPC-7: not executed");
            check("command rejected by handler".equals(r.getObjectProperty(ERROR)), "RPC-7: the error");
            for (String q : new String[] {"q1", "q2"}) {
                r = ask(s, anonymous, queries, replyTo, replies, q);
                check(("result:" + q).equals(r.getBody(String.class)), "RPC-8: the answer");
                check(r.getObjectProperty(EXECUTED) == null, "RPC-8: no executed property");
            }
            replies.close();
            replyTo.delete();
        }
        System.out.println("PASS request");
    }
}
