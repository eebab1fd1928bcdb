import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

import javax.jms.Connection;
import javax.jms.JMSException;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Session;
import javax.jms.Topic;

import org.apache.qpid.jms.JmsConnectionFactory;

/**
 * Events and events-store with Qpid JMS topics: {@code java EventsScenarios SCENARIO URL}.
 * Prints "PASS SCENARIO" when every check held; exits non-zero with the failed check otherwise.
 */
public final class EventsScenarios {
    private static final long TIMEOUT_MS = 10_000;

    private EventsScenarios() {}

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    private static Connection connect(String url, String clientId) throws JMSException {
        Connection c = new JmsConnectionFactory(url).createConnection();
        if (clientId != null) {
            c.setClientID(clientId);
        }
        c.start();
        return c;
    }

    private static String unique(String name) {
        return name + "." + UUID.randomUUID().toString().substring(0, 8);
    }

    /** Every message that arrives until a receive waits {@code quietMs} for nothing. */
    private static List<String> drain(MessageConsumer c, long quietMs) throws JMSException {
        List<String> got = new ArrayList<>();
        for (Message m = c.receive(TIMEOUT_MS); m != null; m = c.receive(quietMs)) {
            got.add(m.getBody(String.class));
        }
        return got;
    }

    private static void send(Session s, Topic t, String... bodies) throws JMSException {
        try (MessageProducer p = s.createProducer(t)) {
            for (String b : bodies) {
                Message m = s.createTextMessage(b);
                m.setStringProperty("color", b.startsWith("red") ? "red" : "blue");
                p.send(m);
            }
        }
    }

    /**
     * EV-9 and SEL-1 / SEL-4 with JMS: two topic subscribers get every event; a subscriber with
     * a selector (Qpid JMS trusts it only when the reply ATTACH echoes the filter) gets the red
     * ones.
     */
    private static void topic(String url) throws JMSException {
        try (Connection c = connect(url, null);
                Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE)) {
            Topic t = s.createTopic("events/" + unique("java.topic"));
            MessageConsumer a = s.createConsumer(t);
            MessageConsumer b = s.createConsumer(t);
            MessageConsumer red = s.createConsumer(t, "color = 'red'");
            send(s, t, "red-1", "blue-1", "red-2", "blue-2");
            List<String> all = List.of("red-1", "blue-1", "red-2", "blue-2");
            check(drain(a, 500).equals(all), "a");
            check(drain(b, 500).equals(all), "b");
            check(drain(red, 500).equals(List.of("red-1", "red-2")), "the selector");
        }
    }

    /**
     * DUR-1, DUR-4, DUR-9 with JMS durable subscriptions: 3 received, the consumer closed, 5
     * published, the subscription resumed with exactly those 5; unsubscribe deletes it, and a
     * new subscription of that name starts with new events only.
     */
    private static void durable(String url) throws JMSException {
        String topicName = "events-store/" + unique("java.dur");
        try (Connection c = connect(url, "java-durable");
                Session s = c.createSession(false, Session.AUTO_ACKNOWLEDGE)) {
            Topic t = s.createTopic(topicName);
            MessageConsumer sub = s.createDurableConsumer(t, "sub1");
            send(s, t, "a0", "a1", "a2");
            check(drain(sub, 500).equals(List.of("a0", "a1", "a2")), "first three");
            sub.close();
            send(s, t, "b0", "b1", "b2", "b3", "b4");
            sub = s.createDurableConsumer(t, "sub1");
            List<String> resumed = drain(sub, 500);
            check(resumed.equals(List.of("b0", "b1", "b2", "b3", "b4")), "resumed: " + resumed);
            sub.close();
            s.unsubscribe("sub1");
            sub = s.createDurableConsumer(t, "sub1");
            check(sub.receive(1_000) == null, "a fresh subscription starts with new events");
            send(s, t, "c0");
            check(drain(sub, 500).equals(List.of("c0")), "the new event");
            sub.close();
            s.unsubscribe("sub1");
        }
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "topic" -> topic(args[1]);
            case "durable" -> durable(args[1]);
            default -> throw new IllegalArgumentException("unknown scenario " + args[0]);
        }
        System.out.println("PASS " + args[0]);
    }
}
