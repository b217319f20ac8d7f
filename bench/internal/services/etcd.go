package services

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Etcd is an etcd server started for a run.
type Etcd struct {
	Endpoint string // http://127.0.0.1:port
	Version  string
	DataDir  string
	c        *child
}

// StartEtcd starts etcd (Debian's etcd-server package) on free loopback
// ports with a temporary data directory, and waits until it is healthy.
func StartEtcd() (*Etcd, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("no etcd binary (apt-get install etcd-server; bench/run.sh does it)")
	}
	ver := ""
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(l, "etcd Version: "); ok {
				ver = strings.TrimSpace(v)
			}
		}
	}
	parent := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		parent = "/dev/shm"
	}
	dir, err := os.MkdirTemp(parent, "pgxlockbench-etcd-*")
	if err != nil {
		return nil, err
	}
	cport, err1 := freePort()
	pport, err2 := freePort()
	if err1 != nil || err2 != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pick ports: %v %v", err1, err2)
	}
	client := "http://127.0.0.1:" + strconv.Itoa(cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(pport)
	c, err := startChild(bin,
		"--name", "bench", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "error")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	e := &Etcd{Endpoint: client, Version: ver, DataDir: dir, c: c}
	deadline := time.Now().Add(20 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get(client + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return e, nil
			}
		}
		if c.exited() || time.Now().After(deadline) {
			e.Stop()
			return nil, fmt.Errorf("etcd did not become healthy on %s: %v\n%s", client, err, c.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops etcd and removes its data directory. Idempotent.
func (e *Etcd) Stop() {
	if e == nil || e.c == nil {
		return
	}
	e.c.stop(10 * time.Second)
	e.c = nil
	os.RemoveAll(e.DataDir)
}
