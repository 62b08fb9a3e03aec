// A Toxiproxy server with one more toxic, `latency_us`: the stock `latency` toxic counts whole
// milliseconds, and the shared tier's question is what 0.1 ms and 0.5 ms between a Lacquer node
// and its memcached servers cost (a LAN, not a WAN). Everything else is Toxiproxy 2.12.0's server
// as `cmd/server` runs it: same API, same toxics.
package main

import (
	"flag"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// MicroLatencyToxic delays every chunk by `latency` microseconds (+/- `jitter`), like
// toxics.LatencyToxic does in milliseconds.
type MicroLatencyToxic struct {
	Latency int64 `json:"latency"`
	Jitter  int64 `json:"jitter"`
}

func (t *MicroLatencyToxic) GetBufferSize() int { return 1024 }

func (t *MicroLatencyToxic) Pipe(stub *toxics.ToxicStub) {
	delay := time.Duration(t.Latency) * time.Microsecond
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			sleep := delay - time.Since(c.Timestamp)
			if sleep > 0 {
				select {
				case <-time.After(sleep):
				case <-stub.Interrupt:
					stub.Output <- c
					return
				}
			}
			stub.Output <- c
		}
	}
}

func main() {
	host := flag.String("host", "127.0.0.1", "API host")
	port := flag.String("port", "8474", "API port")
	flag.Parse()
	toxics.Register("latency_us", new(MicroLatencyToxic))
	logger := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	go func() {
		if err := server.Listen(net.JoinHostPort(*host, *port)); err != nil {
			logger.Err(err).Msg("server finished with error")
		}
	}()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
	_ = server.Shutdown()
}
