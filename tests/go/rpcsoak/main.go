// Command rpcsoak drives commands and queries through a connector the way the reference
// connector's burn-in harness drives its two RPC workers, with the same client (go-amqp v1.7.0)
// and the same traffic: per pattern one responder connection (a receiver with standing credit
// 100 and an anonymous sender) and one requester connection (a dynamic reply node and a request
// sender, neither with a settle mode), every connection with the channel's container-id and SASL
// ANONYMOUS; requests at 30/s without a ttl, each a Data body of random bytes with the
// worker-id, sequence, crc and timestamp-ns application-properties; the responder echoes body
// and properties to the request's reply-to with its correlation-id, a command's reply stamped
// x-opt-kubemq-executed = true and x-opt-kubemq-error = ""; the requester waits at most 5 s for
// each reply and rebuilds its links after a timeout.
//
// The harness itself cannot be fetched on this machine; this program is its stand-in, written
// from its documented behaviour. Usage: rpcsoak URL SECONDS [fixed|distribution]: bodies of
// 1,024 bytes (the 1-hour soak's configuration, the default) or of 256 bytes, 4 KiB and 64 KiB
// in the proportions 80:15:5 (the 168-hour run's). After a 3 s warm-up whose counts are
// dropped it measures for SECONDS, prints each pattern's counts, and prints "PASS rpc-soak" when
// every request of the window was answered in time, correlated, executed (commands) and intact
// (a reply that carries the crc matches its body); it exits 1 otherwise.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/crc32"
	"log"
	mathrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/Azure/go-amqp"
)

const (
	ratePerSecond = 30
	credit        = 100
	replyBudget   = 5 * time.Second
	warmUp        = 3 * time.Second
	executed      = "x-opt-kubemq-executed"
	errorText     = "x-opt-kubemq-error"
)

// The self-accounting application-properties every request carries.
const (
	propWorker    = "worker-id"
	propSequence  = "sequence"
	propCRC       = "crc"
	propTimestamp = "timestamp-ns"
)

// counts are one pattern's outcomes.
type counts struct {
	sent, success, timeouts, errors, corrupted atomic.Uint64
}

func (c *counts) reset() {
	for _, n := range []*atomic.Uint64{&c.sent, &c.success, &c.timeouts, &c.errors, &c.corrupted} {
		n.Store(0)
	}
}

// worker is one pattern's channel, address and counts.
type worker struct {
	url, channel, address string
	command               bool
	// size picks each request's body size.
	size   func() int
	counts counts
	// errs keeps the first few failures' texts for the report.
	errsMu sync.Mutex
	errs   []string
}

func (w *worker) failed(kind *atomic.Uint64, format string, args ...any) {
	kind.Add(1)
	w.errsMu.Lock()
	defer w.errsMu.Unlock()
	if len(w.errs) < 5 {
		w.errs = append(w.errs, fmt.Sprintf(format, args...))
	}
}

func (w *worker) dial(ctx context.Context) (*amqp.Conn, *amqp.Session, error) {
	dialCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := amqp.Dial(dialCtx, w.url, &amqp.ConnOptions{
		ContainerID: "burnin-amqp10-" + w.channel,
		SASLType:    amqp.SASLTypeAnonymous(),
	})
	if err != nil {
		return nil, nil, err
	}
	s, err := conn.NewSession(ctx, nil)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, s, nil
}

// respond answers requests until ctx ends, attaching again whenever its links fail.
func (w *worker) respond(ctx context.Context, ready chan<- struct{}) {
	var once sync.Once
	for ctx.Err() == nil {
		conn, s, err := w.dial(ctx)
		if err != nil {
			w.failed(&w.counts.errors, "responder connect: %v", err)
			time.Sleep(time.Second)
			continue
		}
		requests, err := s.NewReceiver(ctx, w.address, &amqp.ReceiverOptions{Credit: credit})
		if err == nil {
			var replies *amqp.Sender
			replies, err = s.NewSender(ctx, "", nil)
			if err == nil {
				once.Do(func() { close(ready) })
				w.serve(ctx, requests, replies)
			}
		}
		if err != nil && ctx.Err() == nil {
			w.failed(&w.counts.errors, "responder attach: %v", err)
			time.Sleep(time.Second)
		}
		_ = conn.Close()
	}
}

func (w *worker) serve(ctx context.Context, requests *amqp.Receiver, replies *amqp.Sender) {
	for {
		req, err := requests.Receive(ctx, nil)
		if err != nil {
			if ctx.Err() == nil {
				w.failed(&w.counts.errors, "responder receive: %v", err)
			}
			return
		}
		_ = requests.AcceptMessage(ctx, req)
		if req.Properties == nil || req.Properties.ReplyTo == nil {
			w.failed(&w.counts.errors, "RPC-12: a request without reply-to")
			continue
		}
		reply := amqp.NewMessage(req.GetData())
		reply.Properties = &amqp.MessageProperties{To: req.Properties.ReplyTo}
		reply.Properties.CorrelationID = req.Properties.CorrelationID
		if reply.Properties.CorrelationID == nil {
			reply.Properties.CorrelationID = req.Properties.MessageID
		}
		reply.ApplicationProperties = map[string]any{}
		for _, k := range []string{propWorker, propSequence, propCRC, propTimestamp} {
			reply.ApplicationProperties[k] = req.ApplicationProperties[k]
		}
		if w.command {
			reply.ApplicationProperties[executed] = true
			reply.ApplicationProperties[errorText] = ""
		}
		sendCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = replies.Send(sendCtx, reply, nil)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.failed(&w.counts.errors, "RPC-13: the reply was refused: %v", err)
			}
			return
		}
	}
}

// requester links: a dynamic reply node and a request sender on one connection.
type requester struct {
	conn    *amqp.Conn
	replies *amqp.Receiver
	replyTo string
	send    *amqp.Sender
}

func (w *worker) attachRequester(ctx context.Context) (*requester, error) {
	conn, s, err := w.dial(ctx)
	if err != nil {
		return nil, err
	}
	replies, err := s.NewReceiver(ctx, "", &amqp.ReceiverOptions{DynamicAddress: true, Credit: credit})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if replies.Address() == "" {
		_ = conn.Close()
		return nil, errors.New("RPC-1: no dynamic node address")
	}
	send, err := s.NewSender(ctx, w.address, nil)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &requester{conn: conn, replies: replies, replyTo: replies.Address(), send: send}, nil
}

// request sends a request every 1/30 s, one at a time, until producing ends; the round trip
// under way then still ends (the harness drains before it stops its responders), so no request
// is left waiting for its timeout. live ends the links.
func (w *worker) request(producing, live context.Context) {
	ctx := live
	var r *requester
	defer func() {
		if r != nil {
			_ = r.conn.Close()
		}
	}()
	tick := time.NewTicker(time.Second / ratePerSecond)
	defer tick.Stop()
	var seq uint64
	for {
		select {
		case <-producing.Done():
			return
		case <-tick.C:
		}
		if r == nil {
			var err error
			if r, err = w.attachRequester(ctx); err != nil {
				if ctx.Err() == nil {
					w.failed(&w.counts.errors, "requester attach: %v", err)
				}
				r = nil
				continue
			}
		}
		seq++
		if !w.roundTrip(ctx, r, seq) {
			// A late reply must not be taken for the next request's: new links.
			_ = r.conn.Close()
			r = nil
		}
	}
}

// roundTrip sends request seq and checks its reply; false when the links are to be rebuilt.
func (w *worker) roundTrip(ctx context.Context, r *requester, seq uint64) bool {
	body := make([]byte, w.size())
	_, _ = rand.Read(body)
	crc := fmt.Sprintf("%08x", crc32.ChecksumIEEE(body))
	corr := w.channel + "-" + strconv.FormatUint(seq, 10)
	req := amqp.NewMessage(body)
	req.ApplicationProperties = map[string]any{
		propWorker:    w.channel,
		propSequence:  strconv.FormatUint(seq, 10),
		propCRC:       crc,
		propTimestamp: strconv.FormatInt(time.Now().UnixNano(), 10),
	}
	req.Properties = &amqp.MessageProperties{ReplyTo: &r.replyTo, CorrelationID: corr}
	sendCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := r.send.Send(sendCtx, req, nil)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.failed(&w.counts.errors, "RPC-4: request %s refused: %v", corr, err)
		}
		return false
	}
	w.counts.sent.Add(1)
	waitCtx, cancel := context.WithTimeout(ctx, replyBudget)
	reply, err := r.replies.Receive(waitCtx, nil)
	cancel()
	switch {
	case ctx.Err() != nil:
		return false
	case errors.Is(err, context.DeadlineExceeded):
		w.failed(&w.counts.timeouts, "no reply to %s within %v", corr, replyBudget)
		return false
	case err != nil:
		w.failed(&w.counts.errors, "reply node: %v", err)
		return false
	}
	_ = r.replies.AcceptMessage(ctx, reply)
	var got any
	if reply.Properties != nil {
		got = reply.Properties.CorrelationID
	}
	if got != corr {
		w.failed(&w.counts.errors, "RPC-6: reply to %s correlated as %v", corr, got)
		return true
	}
	if w.command {
		if ok, _ := reply.ApplicationProperties[executed].(bool); !ok {
			w.failed(&w.counts.errors, "RPC-7: %s not executed: %v", corr, reply.ApplicationProperties)
			return true
		}
	}
	// As the harness does: a reply carrying the worker-id carries the crc of its body.
	if id, _ := reply.ApplicationProperties[propWorker].(string); id != "" {
		want, _ := reply.ApplicationProperties[propCRC].(string)
		if want != fmt.Sprintf("%08x", crc32.ChecksumIEEE(reply.GetData())) {
			w.failed(&w.counts.corrupted, "%s: the reply's body does not match its crc", corr)
		}
	} else if !w.command {
		w.failed(&w.counts.errors, "RPC-8: the query reply to %s lost its properties", corr)
		return true
	}
	w.counts.success.Add(1)
	return true
}

func main() {
	if len(os.Args) < 3 || len(os.Args) > 4 {
		log.Fatal("usage: rpcsoak URL SECONDS [fixed|distribution]")
	}
	size := func() int { return 1024 }
	if len(os.Args) == 4 {
		switch os.Args[3] {
		case "fixed":
		case "distribution":
			size = func() int {
				switch n := mathrand.IntN(100); {
				case n < 80:
					return 256
				case n < 95:
					return 4096
				default:
					return 65536
				}
			}
		default:
			log.Fatalf("sizes: %q", os.Args[3])
		}
	}
	url := os.Args[1]
	seconds, err := strconv.Atoi(os.Args[2])
	if err != nil || seconds < 1 {
		log.Fatalf("SECONDS: %q", os.Args[2])
	}
	workers := []*worker{}
	for _, pattern := range []string{"commands", "queries"} {
		channel := "amqp10.burnin." + pattern + ".0001"
		workers = append(workers, &worker{
			url: url, channel: channel, address: pattern + "/" + channel, command: pattern == "commands",
			size: size,
		})
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range workers {
		ready := make(chan struct{})
		wg.Add(1)
		go func() { defer wg.Done(); w.respond(ctx, ready) }()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			log.Fatalf("%s: the responder did not attach in 30 s: %v", w.address, w.errs)
		}
	}
	producers, stopProducers := context.WithCancel(ctx)
	var asking sync.WaitGroup
	for _, w := range workers {
		asking.Add(1)
		go func() { defer asking.Done(); w.request(producers, ctx) }()
	}
	time.Sleep(warmUp)
	for _, w := range workers {
		w.counts.reset()
	}
	time.Sleep(time.Duration(seconds) * time.Second)
	stopProducers()
	asking.Wait()
	stop()
	wg.Wait()

	pass := true
	for _, w := range workers {
		c := &w.counts
		fmt.Printf("%s: sent %d, answered %d, timeouts %d, errors %d, corrupted %d\n", w.address,
			c.sent.Load(), c.success.Load(), c.timeouts.Load(), c.errors.Load(), c.corrupted.Load())
		for _, e := range w.errs {
			fmt.Println("  " + e)
		}
		// Every request of the window answered; the window saw at least half the rate (the
		// requests are one at a time, so a slow round trip lowers the rate, not the verdict).
		ok := c.timeouts.Load() == 0 && c.errors.Load() == 0 && c.corrupted.Load() == 0 &&
			c.success.Load() >= uint64(seconds*ratePerSecond/2)
		pass = pass && ok
	}
	if !pass {
		os.Exit(1)
	}
	fmt.Println("PASS rpc-soak")
}
