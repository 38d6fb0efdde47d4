package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago, all below the kernel's range of ephemeral ports. A node that stops
// and starts again on its ports (a killed broker, a power cut) must find
// them free: a port from that range can meanwhile become the local end of
// any outgoing connection (a client redialling, a route proxy), and the
// restart then fails with the port in use.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	const low = 10000
	high := ephemeralLow()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close() // the port is free again either way for the test's purpose
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			t.Fatalf("find %d free ports below %d: only %d after %d tries", n, high, len(ports), tries)
		}
		p := low + rand.IntN(high-low)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken: another try
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read or leaves too little room below it).
func ephemeralLow() int {
	var lo, hi int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		_, err = fmt.Sscan(string(b), &lo, &hi)
	}
	if err != nil || lo < 12000 {
		return 32768
	}
	return lo
}
