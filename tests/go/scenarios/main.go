// Command scenarios runs the Queues concept page's behaviours with Azure/go-amqp against a
// connector: go run ./scenarios SCENARIO URL (or respond URL CHANNEL, an RPC responder). It prints "PASS SCENARIO" when every check held
// and exits non-zero with the failed check otherwise.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"time"

	amqp "github.com/Azure/go-amqp"
)

const timeout = 10 * time.Second

func check(ok bool, format string, args ...any) {
	if !ok {
		_ = log.Output(2, fmt.Sprintf("check failed: "+format, args...))
		os.Exit(1)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		_ = log.Output(2, err.Error())
		os.Exit(1)
	}
	return v
}

func session(ctx context.Context, url string) (*amqp.Conn, *amqp.Session) {
	conn := must(amqp.Dial(ctx, url, nil))
	return conn, must(conn.NewSession(ctx, nil))
}

// produce sends each body unsettled; every Send returns once the connector stored it.
func produce(ctx context.Context, s *amqp.Session, addr string, bodies ...string) {
	sender := must(s.NewSender(ctx, addr, nil))
	for _, b := range bodies {
		if err := sender.Send(ctx, amqp.NewMessage([]byte(b)), nil); err != nil {
			log.Fatalf("send %q: %v", b, err)
		}
	}
	_ = sender.Close(ctx)
}

func receive(ctx context.Context, r *amqp.Receiver) *amqp.Message {
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := r.Receive(c, nil)
	if err != nil {
		_ = log.Output(2, "receive: "+err.Error())
		os.Exit(1)
	}
	return m
}

// nothingWithin asserts that no message arrives within d.
func nothingWithin(ctx context.Context, r *amqp.Receiver, d time.Duration) {
	c, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	m, err := r.Receive(c, nil)
	check(err != nil, "unexpected message %q", body(m))
	check(errors.Is(err, context.DeadlineExceeded), "receive ended with %v, not a timeout", err)
}

func body(m *amqp.Message) string {
	if m == nil {
		return ""
	}
	return string(m.GetData())
}

func deliveryCount(m *amqp.Message) uint32 {
	if m.Header == nil {
		return 0
	}
	return m.Header.DeliveryCount
}

// basic: sends are confirmed, a receiver with credit 5 gets them in order, accept removes them.
func basic(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	produce(ctx, s, "queues/go.basic", "m0", "m1", "m2", "m3", "m4")
	r := must(s.NewReceiver(ctx, "queues/go.basic", &amqp.ReceiverOptions{Credit: 5}))
	for i := 0; i < 5; i++ {
		m := receive(ctx, r)
		check(body(m) == fmt.Sprintf("m%d", i), "message %d is %q", i, body(m))
		check(deliveryCount(m) == 0, "first delivery has delivery-count %d", deliveryCount(m))
		check(r.AcceptMessage(ctx, m) == nil, "accept")
	}
	nothingWithin(ctx, r, 1500*time.Millisecond)
}

// credit: with credit 2 and nothing settled, a third message is not sent; settling one lets it
// come (go-amqp re-grants credit as messages are settled).
func credit(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	produce(ctx, s, "queues/go.credit", "c0", "c1", "c2")
	r := must(s.NewReceiver(ctx, "queues/go.credit", &amqp.ReceiverOptions{Credit: 2}))
	first, second := receive(ctx, r), receive(ctx, r)
	nothingWithin(ctx, r, time.Second)
	check(r.AcceptMessage(ctx, first) == nil, "accept")
	third := receive(ctx, r)
	check(body(third) == "c2", "third is %q", body(third))
	check(r.AcceptMessage(ctx, second) == nil && r.AcceptMessage(ctx, third) == nil, "accept")

	check(r.Close(ctx) == nil, "close")

	// Manual credit and drain: a drain ends with what was there and no credit left.
	produce(ctx, s, "queues/go.credit", "d0")
	m := must(s.NewReceiver(ctx, "queues/go.credit", &amqp.ReceiverOptions{Credit: -1}))
	check(m.IssueCredit(5) == nil, "issue credit")
	got := receive(ctx, m)
	check(body(got) == "d0", "drained receiver got %q", body(got))
	check(m.AcceptMessage(ctx, got) == nil, "accept")
	dc, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check(m.DrainCredit(dc, nil) == nil, "drain")
}

// release: a released message comes back as a redelivery (delivery-count ≥ 1); modified with
// delivery-failed does the same.
func release(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	produce(ctx, s, "queues/go.release", "again")
	r := must(s.NewReceiver(ctx, "queues/go.release", &amqp.ReceiverOptions{Credit: 1}))
	m := receive(ctx, r)
	check(deliveryCount(m) == 0 && m.Header.FirstAcquirer, "first delivery: count %d", deliveryCount(m))
	check(r.ReleaseMessage(ctx, m) == nil, "release")
	m = receive(ctx, r)
	check(body(m) == "again" && deliveryCount(m) >= 1, "redelivery %q with count %d", body(m), deliveryCount(m))
	check(r.ModifyMessage(ctx, m, &amqp.ModifyMessageOptions{DeliveryFailed: true}) == nil, "modify")
	m = receive(ctx, r)
	check(body(m) == "again" && deliveryCount(m) >= 2, "second redelivery %q with count %d", body(m), deliveryCount(m))
	check(r.AcceptMessage(ctx, m) == nil, "accept")
	nothingWithin(ctx, r, time.Second)
}

// reject: a rejected message is gone for good; the one behind it still arrives.
func reject(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	produce(ctx, s, "queues/go.reject", "poison", "good")
	r := must(s.NewReceiver(ctx, "queues/go.reject", &amqp.ReceiverOptions{Credit: 2}))
	m := receive(ctx, r)
	check(body(m) == "poison", "first is %q", body(m))
	check(r.RejectMessage(ctx, m, &amqp.Error{Condition: "app:poison", Description: "cannot parse"}) == nil, "reject")
	m = receive(ctx, r)
	check(body(m) == "good", "second is %q", body(m))
	check(r.AcceptMessage(ctx, m) == nil, "accept")
	nothingWithin(ctx, r, 1500*time.Millisecond)
}

// teardown: a consumer whose connection closes with unsettled deliveries loses nothing; a fresh
// consumer gets them all again, as redeliveries.
func teardown(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	produce(ctx, s, "queues/go.teardown", "t0", "t1", "t2")
	wconn, ws := session(ctx, url)
	w := must(ws.NewReceiver(ctx, "queues/go.teardown", &amqp.ReceiverOptions{Credit: 3}))
	for i := 0; i < 3; i++ {
		receive(ctx, w) // never settled
	}
	check(wconn.Close() == nil, "worker close")
	r := must(s.NewReceiver(ctx, "queues/go.teardown", &amqp.ReceiverOptions{Credit: 3}))
	var got []string
	for i := 0; i < 3; i++ {
		m := receive(ctx, r)
		check(deliveryCount(m) >= 1, "%q came back with delivery-count %d", body(m), deliveryCount(m))
		got = append(got, body(m))
		check(r.AcceptMessage(ctx, m) == nil, "accept")
	}
	sort.Strings(got)
	check(fmt.Sprint(got) == "[t0 t1 t2]", "redelivered %v", got)
}

// collect receives until no message arrives for quiet.
func collect(ctx context.Context, r *amqp.Receiver, quiet time.Duration) []string {
	var got []string
	for {
		c, cancel := context.WithTimeout(ctx, quiet)
		m, err := r.Receive(c, nil)
		cancel()
		if err != nil {
			return got
		}
		got = append(got, string(m.GetData()))
	}
}

func equal(a, b []string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// events: EV-9 fan-out to two subscribers, GRP-2 a group of two, SEL-1 go-amqp's selector
// filter (the numeric descriptor), from a pre-settled publisher.
func events(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	addr := fmt.Sprintf("events/go.ev.%d", time.Now().UnixNano())
	opts := func(props map[string]any, filters ...amqp.LinkFilter) *amqp.ReceiverOptions {
		return &amqp.ReceiverOptions{Credit: 100, Properties: props, Filters: filters}
	}
	a := must(s.NewReceiver(ctx, addr, opts(nil)))
	b := must(s.NewReceiver(ctx, addr, opts(nil)))
	g := map[string]any{"x-opt-kubemq-group": "g"}
	g1 := must(s.NewReceiver(ctx, addr, opts(g)))
	g2 := must(s.NewReceiver(ctx, addr, opts(g)))
	red := must(s.NewReceiver(ctx, addr, opts(nil, amqp.NewSelectorFilter("color = 'red'"))))
	sender := must(s.NewSender(ctx, addr, &amqp.SenderOptions{SettlementMode: amqp.SenderSettleModeSettled.Ptr()}))
	var sent []string
	for i := 0; i < 10; i++ {
		body := fmt.Sprintf("e%d", i)
		m := amqp.NewMessage([]byte(body))
		color := "blue"
		if i%2 == 0 {
			color = "red"
		}
		m.ApplicationProperties = map[string]any{"color": color}
		check(sender.Send(ctx, m, nil) == nil, "send %s", body)
		sent = append(sent, body)
	}
	check(equal(collect(ctx, a, time.Second), sent), "a got every event")
	check(equal(collect(ctx, b, time.Second), sent), "b got every event")
	shared := append(collect(ctx, g1, time.Second), collect(ctx, g2, time.Second)...)
	sort.Strings(shared)
	check(equal(shared, sent), "the group got each event once: %v", shared)
	check(equal(collect(ctx, red, time.Second), []string{"e0", "e2", "e4", "e6", "e8"}), "the selector")
}

// store: SP-9 start positions and DUR-4 a durable subscription resumed after its link closed.
func store(ctx context.Context, url string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	addr := fmt.Sprintf("events-store/go.es.%d", time.Now().UnixNano())
	produce(ctx, s, addr, "s0", "s1", "s2")
	from := func(position string) []string {
		r := must(s.NewReceiver(ctx, addr, &amqp.ReceiverOptions{
			Credit: 100, Properties: map[string]any{"x-opt-kubemq-start": position},
		}))
		defer r.Close(ctx)
		return collect(ctx, r, time.Second)
	}
	check(equal(from("first"), []string{"s0", "s1", "s2"}), "first")
	check(equal(from("sequence:3"), []string{"s2"}), "sequence:3")
	// DUR-1: the source's expiry policy (go-amqp's ExpiryPolicy is the target's).
	durable := &amqp.ReceiverOptions{
		Credit: 100, Name: "go-durable", SourceDurability: amqp.DurabilityUnsettledState,
		SourceExpiryPolicy: amqp.ExpiryPolicyNever,
	}
	r := must(s.NewReceiver(ctx, addr, durable))
	produce(ctx, s, addr, "d0")
	check(equal(collect(ctx, r, time.Second), []string{"d0"}), "the durable subscription's first event")
	check(r.Close(ctx) == nil, "close")
	produce(ctx, s, addr, "d1", "d2")
	r = must(s.NewReceiver(ctx, addr, durable))
	got := collect(ctx, r, time.Second)
	check(equal(got, []string{"d1", "d2"}), "resumed with what came meanwhile: %v", got)
}

// text is a request's body: an AmqpValue string (proton, rhea, Qpid JMS text messages) or Data.
func text(m *amqp.Message) string {
	if s, ok := m.Value.(string); ok {
		return s
	}
	return body(m)
}

// respond answers the RPC pair protocol on commands/CHANNEL and queries/CHANNEL (see
// tests/python/rpc.py): two commands ("fail" is refused with an error) and two queries
// (answered "result:<request>"), through one anonymous sender. It prints READY once subscribed.
func respond(ctx context.Context, url, channel string) {
	conn, s := session(ctx, url)
	defer conn.Close()
	replies := must(s.NewSender(ctx, "", nil))
	commands := must(s.NewReceiver(ctx, "commands/"+channel, &amqp.ReceiverOptions{Credit: 10}))
	queries := must(s.NewReceiver(ctx, "queries/"+channel, &amqp.ReceiverOptions{Credit: 10}))
	fmt.Println("READY")
	for _, r := range []*amqp.Receiver{commands, commands, queries, queries} {
		m := receive(ctx, r)
		check(r.AcceptMessage(ctx, m) == nil, "accept the request")
		check(m.Properties != nil && m.Properties.ReplyTo != nil, "RPC-12: a reply-to")
		reply := &amqp.Message{Properties: &amqp.MessageProperties{
			To:            m.Properties.ReplyTo,
			CorrelationID: m.Properties.CorrelationID,
		}}
		if r == commands {
			ok := text(m) != "fail"
			reply.ApplicationProperties = map[string]any{"x-opt-kubemq-executed": ok}
			if !ok {
				reply.ApplicationProperties["x-opt-kubemq-error"] = "command rejected by handler"
			}
		} else {
			reply.Value = "result:" + text(m)
		}
		check(replies.Send(ctx, reply, nil) == nil, "RPC-13: the reply is accepted")
	}
}

func main() {
	log.SetFlags(log.Lshortfile)
	if len(os.Args) == 4 && os.Args[1] == "respond" {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		respond(ctx, os.Args[2], os.Args[3])
		fmt.Println("PASS respond")
		return
	}
	if len(os.Args) != 3 {
		log.Fatalf("usage: scenarios SCENARIO URL | scenarios respond URL CHANNEL")
	}
	scenarios := map[string]func(context.Context, string){
		"basic": basic, "credit": credit, "release": release, "reject": reject, "teardown": teardown,
		"events": events, "store": store,
	}
	run, ok := scenarios[os.Args[1]]
	if !ok {
		log.Fatalf("unknown scenario %q", os.Args[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run(ctx, os.Args[2])
	fmt.Println("PASS", os.Args[1])
}
