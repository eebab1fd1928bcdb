import java.util.HashSet;
import java.util.Set;

import javax.jms.Connection;
import javax.jms.Message;
import javax.jms.MessageConsumer;
import javax.jms.MessageProducer;
import javax.jms.Queue;
import javax.jms.Session;
import javax.jms.TextMessage;

import org.apache.qpid.jms.JmsConnectionFactory;

public final class Main {
    private static final String CHANNEL = "amqp10.examples.basic";
    private static final int TOTAL = 10;

    public static void main(String[] args) throws Exception {
        String url = System.getenv().getOrDefault("KUBEMQ_AMQP_URL", "amqp://localhost:5672");
        String address = "queues/" + CHANNEL; // queues/ prefix → KubeMQ Queues pattern

        JmsConnectionFactory factory = new JmsConnectionFactory(url);
        try (Connection connection = factory.createConnection()) {
            connection.start();
            try (Session session = connection.createSession(false, Session.CLIENT_ACKNOWLEDGE)) {
                Queue queue = session.createQueue(address);

                // 1. Produce — a MessageProducer is a server-receiver link; each send
                //    blocks for the accepted DISPOSITION (unsettled, at-least-once).
                try (MessageProducer producer = session.createProducer(queue)) {
                    for (int i = 0; i < TOTAL; i++) {
                        producer.send(session.createTextMessage(String.format("msg-%03d", i)));
                    }
                }

                // 2. Consume — a CLIENT_ACKNOWLEDGE consumer; acknowledge() settles
                //    `accepted` ⇒ AckRange (removed from the queue).
                try (MessageConsumer consumer = session.createConsumer(queue)) {
                    Set<String> seen = new HashSet<>();
                    while (seen.size() < TOTAL) {
                        Message msg = consumer.receive(30_000);
                        if (msg == null) throw new IllegalStateException("timed out");
                        String body = msg.getBody(String.class);
                        msg.acknowledge();
                        seen.add(body);
                    }
                    System.out.printf("consumed and accepted %d messages%n", seen.size());

                    // 3. Assert the queue is empty — a further receive times out.
                    if (consumer.receive(2_000) != null) {
                        throw new IllegalStateException("expected an empty queue");
                    }
                }
            }
        }
    }
}
