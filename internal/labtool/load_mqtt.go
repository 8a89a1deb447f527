package labtool

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

const (
	// mqttPayloadSize is the made-up part of a load message.
	mqttPayloadSize = 64
	// mqttFillQuiet ends the wait for a batch of retained messages once
	// none came for it (a cleared one never comes).
	mqttFillQuiet = 2 * time.Second
)

// mqttDrain is how long the end waits for messages once none has
// arrived: past it, the ones still missing are lost. (A variable for the
// tests.)
var mqttDrain = 10 * time.Second

// mqttMsg is one numbered message of a publisher.
type mqttMsg struct {
	sent time.Time
	// acked: the broker's PUBACK came; the message is promised.
	acked bool
	// settled: delivered, or its publish failed (which ends the wait).
	settled    bool
	deliveries int
}

// mqttLoad publishes numbered QoS 1 messages on load/<run> from each of
// its connections and receives them on one more, a QoS 1 subscriber; all
// have persistent sessions (clean session false) on kept connections. A
// request is a message; its latency runs from publish to delivery. The
// check: every message the broker acknowledged was delivered exactly once.
type mqttLoad struct {
	addr, runName string
	rec           *recorder
	pubs          []mqtt.Client
	sub           mqtt.Client
	pending       sync.WaitGroup // goroutines waiting on PUBACKs
	warmed        chan struct{}  // a warm-up message came through

	mu       sync.Mutex
	msgs     [][]*mqttMsg // by publisher, by number
	corrupt  int          // deliveries whose payload was not the one sent
	strays   int          // deliveries of numbers never sent
	progress time.Time    // the last delivery or failure
}

func (w *mqttLoad) topic() string { return "load/" + w.runName }

func mqttPayload(run string, lane, seq int) []byte {
	p := fmt.Appendf(nil, "%d %d ", lane, seq)
	return append(p, value(fmt.Sprintf("%s/%d/%d", run, lane, seq), mqttPayloadSize)...)
}

// mqttOptions are a client's options: a minute for anything to be
// answered, so that a frozen broker shows as a stall; reconnecting on its
// own, quickly, after a lost connection.
func mqttOptions(addr, id string, clean bool) *mqtt.ClientOptions {
	return mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).
		SetCleanSession(clean).SetConnectTimeout(5 * time.Second).
		SetKeepAlive(30 * time.Second).SetPingTimeout(answerWait).
		SetAutoReconnect(true).SetMaxReconnectInterval(500 * time.Millisecond).
		SetOrderMatters(false)
}

// mqttWait waits for t, at most d.
func mqttWait(t mqtt.Token, d time.Duration) error {
	if !t.WaitTimeout(d) {
		return fmt.Errorf("no answer in %v", d)
	}
	return t.Error()
}

// countConnects counts a reconnect at every connection of a client past
// its first, and an error at every loss (the client resends on its own,
// so no request fails with it).
func countConnects(o *mqtt.ClientOptions, rec *recorder, then func(mqtt.Client)) {
	var connects atomic.Int64
	o.SetOnConnectHandler(func(c mqtt.Client) {
		if connects.Add(1) > 1 {
			rec.reconnected()
		}
		if then != nil {
			then(c)
		}
	})
	o.SetConnectionLostHandler(func(mqtt.Client, error) { rec.failed(time.Now()) })
}

func connectMQTT(ctx context.Context, o LoadOptions, rec *recorder) (workload, error) {
	w := &mqttLoad{addr: o.Addr, runName: o.Run, rec: rec, msgs: make([][]*mqttMsg, o.Conns),
		warmed: make(chan struct{}, o.Conns)}
	// The subscriber subscribes again at every connection: a broker that
	// lost its sessions (restarted without persistence) forgot it.
	subscribed := make(chan error, 1)
	so := mqttOptions(o.Addr, "ferry-"+o.Run+"-sub", false)
	countConnects(so, rec, func(c mqtt.Client) {
		err := mqttWait(c.Subscribe(w.topic(), 1, w.deliver), answerWait)
		select {
		case subscribed <- err:
		default:
		}
	})
	w.sub = mqtt.NewClient(so)
	if err := mqttWait(w.sub.Connect(), 10*time.Second); err != nil {
		return nil, err
	}
	select {
	case err := <-subscribed:
		if err != nil {
			w.close()
			return nil, fmt.Errorf("subscribing to %s: %w", w.topic(), err)
		}
	case <-ctx.Done():
		w.close()
		return nil, ctx.Err()
	}
	for k := range o.Conns {
		po := mqttOptions(o.Addr, fmt.Sprintf("ferry-%s-pub%d", o.Run, k), false)
		countConnects(po, rec, nil)
		c := mqtt.NewClient(po)
		if err := mqttWait(c.Connect(), 10*time.Second); err != nil {
			w.close()
			return nil, err
		}
		w.pubs = append(w.pubs, c)
	}
	// One message from each publisher through the broker before the
	// first one timed: a fresh connection's first exchange can wait on a
	// delayed ACK (40 ms) that no later one does.
	for _, c := range w.pubs {
		if err := mqttWait(c.Publish(w.topic(), 1, false, mqttWarmUp), 10*time.Second); err != nil {
			w.close()
			return nil, err
		}
		select {
		case <-w.warmed:
		case <-time.After(10 * time.Second):
			w.close()
			return nil, fmt.Errorf("a warm-up message published on %s never came back", w.topic())
		}
	}
	return w, nil
}

// mqttWarmUp is the payload of the messages sent before the load.
var mqttWarmUp = []byte("warm-up")

// deliver takes a message the subscriber received.
func (w *mqttLoad) deliver(_ mqtt.Client, m mqtt.Message) {
	p := m.Payload()
	if bytes.Equal(p, mqttWarmUp) {
		select {
		case w.warmed <- struct{}{}:
		default: // one sent again after a reconnect
		}
		return
	}
	var lane, seq int
	_, err := fmt.Sscanf(string(p[:min(len(p), 40)]), "%d %d ", &lane, &seq)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil:
		w.corrupt++
	case lane < 0 || lane >= len(w.msgs) || seq < 0 || seq >= len(w.msgs[lane]):
		w.strays++
	case !bytes.Equal(p, mqttPayload(w.runName, lane, seq)):
		w.corrupt++
	default:
		msg := w.msgs[lane][seq]
		msg.deliveries++
		if !msg.settled {
			msg.settled = true
			w.rec.answer(lane, msg.sent, nil)
		}
		w.progress = time.Now()
	}
}

func (w *mqttLoad) run(ctx context.Context, rate float64, stop <-chan struct{}) {
	tick(ctx, len(w.pubs), rate, stop, func(lane, seq int) {
		msg := &mqttMsg{}
		w.mu.Lock()
		w.msgs[lane] = append(w.msgs[lane], msg)
		msg.sent = w.rec.send(lane)
		w.mu.Unlock()
		t := w.pubs[lane].Publish(w.topic(), 1, false, mqttPayload(w.runName, lane, seq))
		w.pending.Go(func() {
			err := mqttWait(t, answerWait)
			w.mu.Lock()
			defer w.mu.Unlock()
			if err == nil {
				msg.acked = true
				return
			}
			if !msg.settled {
				msg.settled = true
				w.rec.answer(lane, msg.sent, err)
				w.progress = time.Now()
			}
		})
	})
	w.pending.Wait()
	w.drain()
}

// drain waits for the messages still on their way, until none has come
// for mqttDrain; those that never come are failures (and, if the broker
// had acknowledged them, lost: see check).
func (w *mqttLoad) drain() {
	w.mu.Lock()
	w.progress = time.Now()
	w.mu.Unlock()
	for {
		w.mu.Lock()
		waiting := 0
		for _, msgs := range w.msgs {
			for _, m := range msgs {
				if !m.settled {
					waiting++
				}
			}
		}
		quiet := time.Since(w.progress)
		w.mu.Unlock()
		if waiting == 0 {
			return
		}
		if quiet > mqttDrain {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, msgs := range w.msgs {
		for _, m := range msgs {
			if !m.settled {
				m.settled = true
				w.rec.failed(m.sent)
			}
		}
	}
}

func (w *mqttLoad) check(ctx context.Context) (bool, string, error) {
	w.mu.Lock()
	var sent, acked, delivered, lost, dup int
	for _, msgs := range w.msgs {
		for _, m := range msgs {
			sent++
			if m.acked {
				acked++
			}
			if m.deliveries > 0 {
				delivered++
			}
			if m.acked && m.deliveries == 0 {
				lost++
			}
			dup += max(m.deliveries-1, 0)
		}
	}
	corrupt, strays := w.corrupt, w.strays
	w.mu.Unlock()
	fr, err := checkFillMQTT(ctx, w.addr)
	if err != nil {
		return false, "", err
	}
	state := fmt.Sprintf("messages: %d published, %d acknowledged, %d delivered; lost %d, duplicated %d, corrupt %d, never sent %d; %s",
		sent, acked, delivered, lost, dup, corrupt, strays, fr)
	return lost == 0 && dup == 0 && corrupt == 0 && strays == 0 && fr.ok(), state, nil
}

func (w *mqttLoad) close() {
	if w.sub != nil && w.sub.IsConnected() {
		// The session outlives the client: unsubscribed, it stops
		// collecting the topic's messages.
		_ = mqttWait(w.sub.Unsubscribe(w.topic()), 5*time.Second)
	}
	for _, c := range append(w.pubs, w.sub) {
		if c != nil {
			c.Disconnect(250)
		}
	}
}

// mqttFillMarker is the retained topic holding "<items> <size>".
const mqttFillMarker = "fill/count"

func mqttFillTopic(n int) string { return "fill/" + strconv.Itoa(n) }

func connectMQTTOnce(addr string) (mqtt.Client, error) {
	c := mqtt.NewClient(mqttOptions(addr, "ferry-fill-"+newRunName(), true))
	if err := mqttWait(c.Connect(), 10*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

// fillMQTT publishes retained QoS 1 messages, a window of them at a time.
func fillMQTT(ctx context.Context, addr string, bytes int64) error {
	c, err := connectMQTTOnce(addr)
	if err != nil {
		return err
	}
	defer c.Disconnect(250)
	n := fillCount(bytes, fillValueSize)
	const window = 100
	for start := 0; start < n; start += window {
		var toks []mqtt.Token
		for i := start; i < min(start+window, n); i++ {
			toks = append(toks, c.Publish(mqttFillTopic(i), 1, true, value(mqttFillTopic(i), fillValueSize)))
		}
		for _, t := range toks {
			if err := mqttWait(t, answerWait); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return mqttWait(c.Publish(mqttFillMarker, 1, true, fmt.Sprintf("%d %d", n, fillValueSize)), answerWait)
}

// retained subscribes to topics and collects their retained messages
// until it has one for each, or none came for quiet.
func retained(c mqtt.Client, topics []string, quiet time.Duration) (map[string][]byte, error) {
	var mu sync.Mutex
	got := map[string][]byte{}
	came := make(chan struct{}, 1)
	filters := map[string]byte{}
	for _, t := range topics {
		filters[t] = 1
	}
	full := make(chan struct{})
	if err := mqttWait(c.SubscribeMultiple(filters, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		defer mu.Unlock()
		if _, want := filters[m.Topic()]; !want || !m.Retained() {
			return
		}
		got[m.Topic()] = m.Payload()
		select {
		case came <- struct{}{}:
		default:
		}
		if len(got) == len(filters) {
			select {
			case <-full:
			default:
				close(full)
			}
		}
	}), answerWait); err != nil {
		return nil, err
	}
	for waiting := true; waiting; {
		select {
		case <-full:
			waiting = false
		case <-came:
		case <-time.After(quiet):
			waiting = false
		}
	}
	if err := mqttWait(c.Unsubscribe(topics...), answerWait); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return got, nil
}

// checkFillMQTT reads every retained fill message back, in batches under
// mosquitto's default queue of 1000 messages per client.
func checkFillMQTT(_ context.Context, addr string) (fillReport, error) {
	c, err := connectMQTTOnce(addr)
	if err != nil {
		return fillReport{}, err
	}
	defer c.Disconnect(250)
	m, err := retained(c, []string{mqttFillMarker}, mqttFillQuiet)
	if err != nil {
		return fillReport{}, err
	}
	marker, ok := m[mqttFillMarker]
	if !ok {
		return fillReport{}, nil
	}
	items, size, err := parseFillMarker(string(marker))
	if err != nil {
		return fillReport{}, err
	}
	r := fillReport{Items: items, Size: size}
	for start := 0; start < items; start += checkBatch {
		var topics []string
		for i := start; i < min(start+checkBatch, items); i++ {
			topics = append(topics, mqttFillTopic(i))
		}
		got, err := retained(c, topics, mqttFillQuiet)
		if err != nil {
			return r, err
		}
		for _, t := range topics {
			p, ok := got[t]
			switch {
			case !ok:
				r.Missing++
			case !bytes.Equal(p, value(t, size)):
				r.Wrong++
			}
		}
	}
	return r, nil
}
