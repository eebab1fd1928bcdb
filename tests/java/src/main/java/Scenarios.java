import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import javax.jms.Connection;
import javax.jms.JMSException;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Queue;
import javax.jms.Session;

import org.apache.qpid.jms.JmsConnectionFactory;

/**
 * The Queues concept page's behaviours with Qpid JMS against a connector:
 * {@code java Scenarios SCENARIO URL}. Prints "PASS SCENARIO" when every check held; exits
 * non-zero with the failed check otherwise.
 */
public final class Scenarios {
    private static final long TIMEOUT_MS = 10_000;
    /** Qpid JMS's per-message acknowledgement mode. */
    private static final int INDIVIDUAL_ACKNOWLEDGE = 101;
    /** Qpid JMS's per-message outcome property and its values. */
    private static final String ACK_TYPE = "JMS_AMQP_ACK_TYPE";
    private static final int REJECTED = 2;
    private static final int RELEASED = 3;

    private Scenarios() {}

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    private static Connection connect(String url) throws JMSException {
        Connection c = new JmsConnectionFactory(url).createConnection();
        c.start();
        return c;
    }

    private static void produce(Session s, Queue q, String... bodies) throws JMSException {
        try (MessageProducer p = s.createProducer(q)) {
            for (String b : bodies) {
                p.send(s.createTextMessage(b)); // returns once the connector stored it
            }
        }
    }

    private static Message receive(MessageConsumer c) throws JMSException {
        Message m = c.receive(TIMEOUT_MS);
        check(m != null, "no message within " + TIMEOUT_MS + " ms");
        return m;
    }

    private static String body(Message m) throws JMSException {
        return m.getBody(String.class);
    }

    /** Sends are confirmed; one consumer gets them in order, first deliveries, then nothing. */
    private static void basic(String url) throws JMSException {
        try (Connection c = connect(url);
                Session s = c.createSession(false, Session.CLIENT_ACKNOWLEDGE)) {
            Queue q = s.createQueue("queues/java.basic");
            produce(s, q, "m0", "m1", "m2", "m3", "m4");
            try (MessageConsumer consumer = s.createConsumer(q)) {
                for (int i = 0; i < 5; i++) {
                    Message m = receive(consumer);
                    check(body(m).equals("m" + i), "message " + i + " is " + body(m));
                    check(!m.getJMSRedelivered(), body(m) + " marked redelivered");
                    check(m.getIntProperty("JMSXDeliveryCount") == 1, "JMSXDeliveryCount "
                            + m.getIntProperty("JMSXDeliveryCount"));
                    m.acknowledge();
                }
                check(consumer.receive(1_500) == null, "expected an empty queue");
            }
        }
    }

    /** Two consumers on separate connections share one queue: every message once, none twice. */
    private static void competing(String url) throws JMSException {
        try (Connection a = connect(url);
                Connection b = connect(url + "?jms.prefetchPolicy.all=1");
                Session sa = a.createSession(false, Session.AUTO_ACKNOWLEDGE);
                Session sb = b.createSession(false, Session.AUTO_ACKNOWLEDGE)) {
            Queue q = sa.createQueue("queues/java.competing");
            String[] bodies = new String[20];
            for (int i = 0; i < bodies.length; i++) {
                bodies[i] = "w" + i;
            }
            produce(sa, q, bodies);
            List<String> got = new ArrayList<>();
            try (MessageConsumer ca = sa.createConsumer(q);
                    MessageConsumer cb = sb.createConsumer(sb.createQueue("queues/java.competing"))) {
                while (got.size() < bodies.length) {
                    Message m = cb.receive(200);
                    if (m == null) {
                        m = receive(ca);
                    }
                    got.add(body(m));
                }
                check(ca.receive(1_000) == null && cb.receive(500) == null, "a message came twice");
            }
            Set<String> unique = new HashSet<>(got);
            check(unique.size() == bodies.length, "duplicates in " + got);
        }
    }

    /** A released message comes back as a redelivery. */
    private static void release(String url) throws JMSException {
        try (Connection c = connect(url);
                Session s = c.createSession(false, INDIVIDUAL_ACKNOWLEDGE)) {
            Queue q = s.createQueue("queues/java.release");
            produce(s, q, "again");
            try (MessageConsumer consumer = s.createConsumer(q)) {
                Message m = receive(consumer);
                check(!m.getJMSRedelivered(), "first delivery marked redelivered");
                m.setIntProperty(ACK_TYPE, RELEASED);
                m.acknowledge();
                m = receive(consumer);
                check(body(m).equals("again"), "redelivery is " + body(m));
                check(m.getJMSRedelivered() && m.getIntProperty("JMSXDeliveryCount") >= 2,
                        "redelivery not marked: JMSXDeliveryCount " + m.getIntProperty("JMSXDeliveryCount"));
                m.acknowledge();
                check(consumer.receive(1_000) == null, "expected an empty queue");
            }
        }
    }

    /** A rejected message is gone; the one behind it still arrives. */
    private static void reject(String url) throws JMSException {
        try (Connection c = connect(url);
                Session s = c.createSession(false, INDIVIDUAL_ACKNOWLEDGE)) {
            Queue q = s.createQueue("queues/java.reject");
            produce(s, q, "poison", "good");
            try (MessageConsumer consumer = s.createConsumer(q)) {
                Message m = receive(consumer);
                check(body(m).equals("poison"), "first is " + body(m));
                m.setIntProperty(ACK_TYPE, REJECTED);
                m.acknowledge();
                m = receive(consumer);
                check(body(m).equals("good"), "second is " + body(m));
                m.acknowledge();
                check(consumer.receive(1_500) == null, "the rejected message came back");
            }
        }
    }

    /** A consumer whose connection closes unacknowledged loses nothing: all come back, redelivered. */
    private static void teardown(String url) throws JMSException {
        try (Connection c = connect(url);
                Session s = c.createSession(false, Session.CLIENT_ACKNOWLEDGE)) {
            Queue q = s.createQueue("queues/java.teardown");
            produce(s, q, "t0", "t1", "t2");
            try (Connection worker = connect(url);
                    Session ws = worker.createSession(false, Session.CLIENT_ACKNOWLEDGE);
                    MessageConsumer w = ws.createConsumer(ws.createQueue("queues/java.teardown"))) {
                for (int i = 0; i < 3; i++) {
                    receive(w); // never acknowledged
                }
            }
            List<String> got = new ArrayList<>();
            try (MessageConsumer consumer = s.createConsumer(q)) {
                Message m = null;
                for (int i = 0; i < 3; i++) {
                    m = receive(consumer);
                    check(m.getJMSRedelivered(), body(m) + " not marked redelivered");
                    got.add(body(m));
                }
                m.acknowledge(); // CLIENT_ACKNOWLEDGE: every message consumed in the session
                check(consumer.receive(1_500) == null, "a message came back after acknowledge");
            }
            Collections.sort(got);
            check(got.equals(List.of("t0", "t1", "t2")), "redelivered " + got);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            throw new IllegalArgumentException("usage: Scenarios SCENARIO URL");
        }
        switch (args[0]) {
            case "basic" -> basic(args[1]);
            case "competing" -> competing(args[1]);
            case "release" -> release(args[1]);
            case "reject" -> reject(args[1]);
            case "teardown" -> teardown(args[1]);
            default -> throw new IllegalArgumentException("unknown scenario " + args[0]);
        }
        System.out.println("PASS " + args[0]);
    }
}
