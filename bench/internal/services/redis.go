package services

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// EnvRedisAddr names the variable holding the Redis address to use.
const EnvRedisAddr = "REDIS_ADDR"

// Redis is the Redis of a run.
type Redis struct {
	Addr    string
	Version string
	Started bool // a child we started
	c       *child
}

// StartRedis returns the Redis at REDIS_ADDR (default 127.0.0.1:6379) when it
// answers, else starts redis-server on a free loopback port without
// persistence.
func StartRedis() (*Redis, error) {
	addr := os.Getenv(EnvRedisAddr)
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	if v, err := redisInfo(addr); err == nil {
		return &Redis{Addr: addr, Version: v}, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("no Redis at %s and no redis-server binary (apt-get install redis-server)", addr)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	c, err := startChild(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	if err != nil {
		return nil, err
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := redisInfo(addr)
		if err == nil {
			return &Redis{Addr: addr, Version: v, Started: true, c: c}, nil
		}
		if c.exited() || time.Now().After(deadline) {
			c.stop(time.Second)
			return nil, fmt.Errorf("redis-server did not answer on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops a redis-server we started.
func (r *Redis) Stop() {
	if r != nil && r.c != nil {
		r.c.stop(5 * time.Second)
		r.c = nil
	}
}

// redisInfo pings addr with a raw RESP INFO server and returns redis_version.
func redisInfo(addr string) (string, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := nc.Write([]byte("*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(nc)
	head, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(head, "$") {
		return "", fmt.Errorf("unexpected reply %q", strings.TrimSpace(head))
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
}
