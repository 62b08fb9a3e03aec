// The soak's own programs, in one binary (standard library only; `go build soak.go`):
//
//	soak origin -listen ADDR                  an origin whose bodies are named by their URL
//	soak load -nodes A,B -rate N -log FILE    steady mixed load, every body checked
//	soak hostile -nodes A,B -until FILE       garbage requests and slow headers
//	soak report -log FILE -phases FILE        per-phase figures, as a Markdown table
//
// A body's URL is /b/<seed>/<len>/<digest>?ttl=<s>: the origin generates <len> bytes from <seed>
// (SHA-256 in counter mode) and the load generator checks that the body it receives hashes to
// <digest>, so a body served for the wrong URL, cut short or mixed up is counted as wrong. The
// load runs at a fixed rate (an open loop: a slow response does not slow the offered load), and
// each request is logged as: unix-ms, node, latency-ms, status, outcome (ok | wrong | error
// cause), path kind.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: soak origin|load|hostile|report ...")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "origin":
		origin(args)
	case "load":
		load(args)
	case "hostile":
		hostile(args)
	case "report":
		report(args)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

// body is the deterministic body of (seed, n): SHA-256(seed || counter) blocks.
func body(seed uint64, n int) []byte {
	out := make([]byte, 0, n+32)
	var block [16]byte
	binary.BigEndian.PutUint64(block[:8], seed)
	for i := uint64(0); len(out) < n; i++ {
		binary.BigEndian.PutUint64(block[8:], i)
		sum := sha256.Sum256(block[:])
		out = append(out, sum[:]...)
	}
	return out[:n]
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// ---- origin ----

func origin(args []string) {
	fs := flag.NewFlagSet("origin", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address")
	fs.Parse(args)
	var served atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/b/", func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/b/"), "/")
		if len(parts) != 3 {
			http.Error(w, "bad path", 400)
			return
		}
		seed, err1 := strconv.ParseUint(parts[0], 10, 64)
		n, err2 := strconv.Atoi(parts[1])
		if err1 != nil || err2 != nil || n < 0 || n > 8<<20 {
			http.Error(w, "bad path", 400)
			return
		}
		ttl := r.URL.Query().Get("ttl")
		if ttl == "" {
			ttl = "30"
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Cache-Control", "max-age="+ttl)
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(body(seed, n))
	})
	mux.HandleFunc("/served", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, served.Load())
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	http.Serve(ln, mux)
}

// ---- load ----

type target struct {
	path string
	kind string
	want string
}

func makeTarget(seed uint64, n int, ttl int, kind string) target {
	d := digest(body(seed, n))
	return target{fmt.Sprintf("/b/%d/%d/%s?ttl=%d", seed, n, d, ttl), kind, d}
}

func load(args []string) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	nodes := fs.String("nodes", "", "comma-separated host:port of the Lacquer nodes")
	rate := fs.Int("rate", 300, "requests per second, in all")
	duration := fs.Duration("duration", time.Minute, "how long to run")
	logPath := fs.String("log", "requests.log", "per-request log")
	hostHeader := fs.String("host", "soak.example", "Host header")
	fs.Parse(args)
	addrs := strings.Split(*nodes, ",")
	rng := rand.New(rand.NewSource(1))
	// the mix: a hot set (hits after the first fetch), a warm set larger than fits the wait,
	// short-lived objects that keep expiring, a few large bodies (chunked in memcached), and a
	// unique miss now and then
	var hot, warm, brief, large []target
	for i := 0; i < 100; i++ {
		hot = append(hot, makeTarget(uint64(1000+i), 512+rng.Intn(4096), 300, "hot"))
	}
	for i := 0; i < 2000; i++ {
		warm = append(warm, makeTarget(uint64(10000+i), 256+rng.Intn(16384), 120, "warm"))
	}
	for i := 0; i < 200; i++ {
		brief = append(brief, makeTarget(uint64(50000+i), 1024+rng.Intn(2048), 5, "brief"))
	}
	for i := 0; i < 8; i++ {
		large = append(large, makeTarget(uint64(90000+i), 1<<20+rng.Intn(1<<20), 300, "large"))
	}
	var uniqueSeed atomic.Uint64
	uniqueSeed.Store(1 << 40)
	pick := func(r *rand.Rand) target {
		x := r.Intn(1000)
		switch {
		case x < 550:
			return hot[r.Intn(len(hot))]
		case x < 850:
			return warm[r.Intn(len(warm))]
		case x < 950:
			return brief[r.Intn(len(brief))]
		case x < 955:
			return large[r.Intn(len(large))]
		default:
			s := uniqueSeed.Add(1)
			return makeTarget(s, 100+int(s%4000), 60, "unique")
		}
	}
	f, err := os.Create(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := bufio.NewWriterSize(f, 1<<20)
	var mu sync.Mutex
	record := func(line string) {
		mu.Lock()
		out.WriteString(line)
		mu.Unlock()
	}
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConnsPerHost: 256,
			DisableCompression:  true,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		},
	}
	interval := time.Second / time.Duration(*rate)
	end := time.Now().Add(*duration)
	var wg sync.WaitGroup
	var n uint64
	tick := time.NewTicker(interval)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		n++
		seq := n
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(seq)))
			t := pick(r)
			node := int(seq % uint64(len(addrs)))
			req, _ := http.NewRequest("GET", "http://"+addrs[node]+t.path, nil)
			req.Host = *hostHeader
			start := time.Now()
			status, outcome := 0, "ok"
			resp, err := client.Do(req)
			if err != nil {
				outcome = "error:" + cause(err)
			} else {
				status = resp.StatusCode
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case rerr != nil:
					outcome = "error:body-" + cause(rerr)
				case status != 200:
					outcome = fmt.Sprintf("error:status-%d", status)
				case digest(b) != t.want:
					outcome = "wrong"
				}
			}
			ms := float64(time.Since(start).Microseconds()) / 1000
			record(fmt.Sprintf("%d %d %.3f %d %s %s\n", start.UnixMilli(), node, ms, status, outcome, t.kind))
		}()
	}
	tick.Stop()
	wg.Wait()
	out.Flush()
	f.Close()
}

func cause(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "Timeout") || strings.Contains(s, "timeout"):
		return "timeout"
	case strings.Contains(s, "reset"):
		return "reset"
	case strings.Contains(s, "refused"):
		return "refused"
	case strings.Contains(s, "EOF"):
		return "eof"
	default:
		return "other"
	}
}

// ---- hostile clients ----

func hostile(args []string) {
	fs := flag.NewFlagSet("hostile", flag.ExitOnError)
	nodes := fs.String("nodes", "", "comma-separated host:port of the Lacquer nodes")
	duration := fs.Duration("duration", 20*time.Second, "how long to run")
	fs.Parse(args)
	addrs := strings.Split(*nodes, ",")
	end := time.Now().Add(*duration)
	var wg sync.WaitGroup
	garbage := [][]byte{
		[]byte("\x00\x01\x02\xff\xfe GARBAGE\r\n\r\n"),
		[]byte("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"),
		[]byte("GET /" + strings.Repeat("a", 70000) + " HTTP/1.1\r\nHost: a\r\n\r\n"),
		[]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
		[]byte("GET / HTTP/9.9\r\n\r\n"),
	}
	var sent, slow atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) { // garbage, as fast as the proxy answers
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				c, err := net.DialTimeout("tcp", addrs[(w+i)%len(addrs)], time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				c.Write(garbage[i%len(garbage)])
				io.Copy(io.Discard, c)
				c.Close()
				sent.Add(1)
				time.Sleep(5 * time.Millisecond)
			}
		}(w)
	}
	for w := 0; w < 20; w++ {
		wg.Add(1)
		go func(w int) { // slow headers: one byte every 200 ms
			defer wg.Done()
			for time.Now().Before(end) {
				c, err := net.DialTimeout("tcp", addrs[w%len(addrs)], time.Second)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				slow.Add(1)
				head := []byte("GET /b/1/1/x HTTP/1.1\r\nHost: soak.example\r\nX-Slow: " + strings.Repeat("s", 400))
				for _, b := range head {
					if time.Now().After(end) {
						break
					}
					c.SetWriteDeadline(time.Now().Add(time.Second))
					if _, err := c.Write([]byte{b}); err != nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				c.Close()
			}
		}(w)
	}
	wg.Wait()
	fmt.Printf("hostile: %d garbage requests, %d slow-header connections\n", sent.Load(), slow.Load())
}

// ---- report ----

type phase struct {
	name       string
	start, end int64
	originDown bool
}

func report(args []string) {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	logPath := fs.String("log", "requests.log", "per-request log")
	phasesPath := fs.String("phases", "phases.log", "lines: unix-ms name [origin-down]")
	fs.Parse(args)
	var phases []phase
	pf, err := os.Open(*phasesPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sc := bufio.NewScanner(pf)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		t, _ := strconv.ParseInt(f[0], 10, 64)
		if len(phases) > 0 {
			phases[len(phases)-1].end = t
		}
		phases = append(phases, phase{name: f[1], start: t, end: 1 << 62, originDown: len(f) > 2 && f[2] == "origin-down"})
	}
	type stats struct {
		lat              []float64
		n, wrong         int
		errs             map[string]int
		allowed, unknown int
	}
	per := make([]stats, len(phases))
	for i := range per {
		per[i].errs = map[string]int{}
	}
	lf, err := os.Open(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sc = bufio.NewScanner(lf)
	total := stats{errs: map[string]int{}}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		t, _ := strconv.ParseInt(f[0], 10, 64)
		ms, _ := strconv.ParseFloat(f[2], 64)
		i := sort.Search(len(phases), func(i int) bool { return phases[i].end > t })
		if i >= len(phases) || t < phases[i].start {
			continue
		}
		s := &per[i]
		s.n++
		total.n++
		s.lat = append(s.lat, ms)
		switch {
		case f[4] == "wrong":
			s.wrong++
			total.wrong++
		case strings.HasPrefix(f[4], "error:"):
			c := strings.TrimPrefix(f[4], "error:")
			s.errs[c]++
			if phases[i].originDown {
				s.allowed++
			} else {
				s.unknown++
			}
		}
	}
	pct := func(v []float64, p float64) float64 {
		if len(v) == 0 {
			return 0
		}
		sort.Float64s(v)
		return v[int(p*float64(len(v)-1))]
	}
	fmt.Println("| phase | requests | errors (cause) | allowed (origin down) | wrong bodies | p50 ms | p99 ms | max ms |")
	fmt.Println("|---|---:|---|---:|---:|---:|---:|---:|")
	unexpected := 0
	for i, p := range phases {
		s := per[i]
		var causes []string
		for c, k := range s.errs {
			causes = append(causes, fmt.Sprintf("%s: %d", c, k))
		}
		sort.Strings(causes)
		errs := "0"
		if len(causes) > 0 {
			errs = strings.Join(causes, ", ")
		}
		unexpected += s.unknown
		fmt.Printf("| %s | %d | %s | %d | %d | %.1f | %.1f | %.1f |\n", p.name, s.n, errs, s.allowed, s.wrong,
			pct(s.lat, 0.5), pct(s.lat, 0.99), pct(s.lat, 1))
	}
	fmt.Printf("\nrequests: %d, wrong bodies: %d, errors outside origin-down phases: %d\n", total.n, total.wrong, unexpected)
	if total.wrong > 0 || unexpected > 0 {
		os.Exit(1)
	}
}
