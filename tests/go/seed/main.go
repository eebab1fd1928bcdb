package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	amqp "github.com/Azure/go-amqp"
)

const channel = "amqp10.examples.basic"
const total = 10

func amqpURL() string {
	if v := os.Getenv("KUBEMQ_AMQP_URL"); v != "" {
		return v
	}
	return "amqp://localhost:5672"
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := "queues/" + channel // queues/ prefix → KubeMQ Queues pattern

	conn, err := amqp.Dial(ctx, amqpURL(), nil)
	if err != nil {
		log.Fatalf("dial: %v", err)
	}
	defer func() { _ = conn.Close() }()
	session, _ := conn.NewSession(ctx, nil)

	// 1. Produce — each Send is unsettled and blocks for the accepted DISPOSITION.
	sender, _ := session.NewSender(ctx, addr, nil)
	for i := 0; i < total; i++ {
		if err := sender.Send(ctx, amqp.NewMessage([]byte(fmt.Sprintf("msg-%03d", i))), nil); err != nil {
			log.Fatalf("send: %v", err)
		}
	}
	_ = sender.Close(ctx)

	// 2. Consume — grant credit, Receive, AcceptMessage (⇒ AckRange, removed).
	receiver, _ := session.NewReceiver(ctx, addr, &amqp.ReceiverOptions{Credit: 10})
	seen := make(map[string]struct{}, total)
	for len(seen) < total {
		msg, err := receiver.Receive(ctx, nil)
		if err != nil {
			log.Fatalf("receive: %v", err)
		}
		if err := receiver.AcceptMessage(ctx, msg); err != nil {
			log.Fatalf("accept: %v", err)
		}
		seen[string(msg.GetData())] = struct{}{}
	}
	fmt.Printf("consumed and accepted %d messages\n", len(seen))

	// 3. Assert the queue is empty — a further Receive must time out.
	emptyCtx, emptyCancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := receiver.Receive(emptyCtx, nil); err == nil {
		log.Fatal("expected an empty queue")
	}
	emptyCancel()
	_ = receiver.Close(ctx)
}
