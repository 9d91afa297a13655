// Command bench compares `densevm 9p serve` with diod in one run, with the
// same userspace 9P2000.L client (github.com/hugelgupf/p9) over loopback TCP:
//
//   - many-files: walk+open+read+clunk of every file of a ~100k-file tree
//   - seq-read:   one 1 GiB file read sequentially
//   - meta-storm: walk+getattr+clunk of random files, plus create+unlink
//
// The tree is generated once and cached under -dir. Results go to -out as a
// markdown table (ratios densevm/diod, best of -rounds, peak RSS).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hugelgupf/p9/p9"
)

var (
	densevm   = flag.String("densevm", "target/release/densevm", "densevm binary")
	diodBin   = flag.String("diod", "diod", "diod binary")
	dir       = flag.String("dir", "build/9p-bench", "cache directory for the generated tree")
	files     = flag.Int("files", 100000, "number of small files")
	bigMiB    = flag.Int("big-mib", 1024, "size of the sequential-read file in MiB")
	workers   = flag.Int("c", 8, "client goroutines (concurrent requests)")
	rounds    = flag.Int("rounds", 2, "rounds per server (best is reported)")
	metaOps   = flag.Int("meta-ops", 40000, "operations in the metadata storm")
	outPath   = flag.String("out", "", "write the markdown result here too")
	only      = flag.String("only", "", "profile mode: run just this server (densevm or diod), no table")
	msize     = flag.Uint("msize", 65536, "msize the client asks for (diod serves at most 64 KiB reads)")
	perDir    = 1000
	bigName   = "big.bin"
	treeName  = "tree"
	readyName = ".complete"
)

// running servers, stopped by die so that no server outlives the benchmark.
var running sync.Map

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
	running.Range(func(k, _ any) bool {
		k.(*server).stop()
		return true
	})
	os.Exit(1)
}

// makeTree creates (once) dir/tree/dNNN/fNNNN files of 1..4 KiB and dir/big.bin.
func makeTree(root string) {
	marker := filepath.Join(root, fmt.Sprintf("%s-%d-%d", readyName, *files, *bigMiB))
	if _, err := os.Stat(marker); err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "bench: generating %d files + %d MiB under %s (cached)\n", *files, *bigMiB, root)
	os.RemoveAll(root)
	r := rand.New(rand.NewSource(1))
	buf := make([]byte, 4096)
	r.Read(buf)
	for i := 0; i < *files; i++ {
		d := filepath.Join(root, treeName, fmt.Sprintf("d%03d", i/perDir))
		if i%perDir == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				die("%v", err)
			}
		}
		n := 1024 + r.Intn(3072)
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d", i%perDir)), buf[:n], 0o644); err != nil {
			die("%v", err)
		}
	}
	f, err := os.Create(filepath.Join(root, bigName))
	if err != nil {
		die("%v", err)
	}
	chunk := make([]byte, 1<<20)
	for i := 0; i < *bigMiB; i++ {
		r.Read(chunk[:4096])
		if _, err := f.Write(chunk); err != nil {
			die("%v", err)
		}
	}
	f.Close()
	os.WriteFile(marker, nil, 0o644)
}

// warm reads every file once so both servers see a hot page cache.
func warm(root string) {
	filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err == nil {
				io.Copy(io.Discard, f)
				f.Close()
			}
		}
		return nil
	})
}

type server struct {
	name string
	cmd  *exec.Cmd
	addr string
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		die("%v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

func start(name, root string) *server {
	addr := freePort()
	var cmd *exec.Cmd
	switch name {
	case "densevm":
		cmd = exec.Command(*densevm, "9p", "serve", root, "--listen", "tcp:"+addr)
	case "diod":
		// -n: no auth; -S -U root: every attach acts as root (the client sends no uid).
		cmd = exec.Command(*diodBin, "-f", "-n", "-S", "-U", "root", "-e", root, "-l", addr, "-L", "stderr")
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		die("start %s: %v", name, err)
	}
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			s := &server{name: name, cmd: cmd, addr: addr}
			running.Store(s, true)
			return s
		}
		time.Sleep(25 * time.Millisecond)
	}
	die("%s did not listen on %s", name, addr)
	return nil
}

func (s *server) stop() string {
	hwm := "?"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmHWM:") {
				hwm = strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:"))
			}
		}
	}
	running.Delete(s)
	// SIGTERM first (lets a profiler wrapper flush), then SIGKILL.
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	return hwm
}

func connect(s *server, aname string, msize uint32) (*p9.Client, p9.File) {
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		die("%v", err)
	}
	c, err := p9.NewClient(&rewriteConn{Conn: conn}, p9.WithMessageSize(msize))
	if err != nil {
		die("%s: version: %v", s.name, err)
	}
	root, err := c.Attach(aname)
	if err != nil {
		die("%s: attach: %v", s.name, err)
	}
	return c, root
}

func walk(f p9.File, names ...string) (p9.File, error) {
	q, nf, err := f.Walk(names)
	if err != nil {
		return nil, err
	}
	if len(q) != len(names) {
		return nil, fmt.Errorf("partial walk of %v", names)
	}
	return nf, nil
}

// parallel runs fn(i) for i in [0,n) on -c goroutines; returns the elapsed time.
func parallel(n int, fn func(i int, buf []byte) error) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	t0 := time.Now()
	for g := 0; g < *workers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i, buf); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		die("%v", e)
	}
	return time.Since(t0)
}

func manyFiles(root p9.File) time.Duration {
	tree, err := walk(root, treeName)
	if err != nil {
		die("%v", err)
	}
	return parallel(*files, func(i int, buf []byte) error {
		f, err := walk(tree, fmt.Sprintf("d%03d", i/perDir), fmt.Sprintf("f%04d", i%perDir))
		if err != nil {
			return fmt.Errorf("many-files walk: %w", err)
		}
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			return fmt.Errorf("many-files open: %w", err)
		}
		n, err := f.ReadAt(buf, 0)
		if n < 1024 || (err != nil && !errors.Is(err, io.EOF)) {
			return fmt.Errorf("short read %d: %v", n, err)
		}
		return f.Close()
	})
}

func seqRead(root p9.File) time.Duration {
	f, err := walk(root, bigName)
	if err != nil {
		die("%v", err)
	}
	if _, _, err := f.Open(p9.ReadOnly); err != nil {
		die("%v", err)
	}
	buf := make([]byte, 1<<20)
	t0 := time.Now()
	var off int64
	for {
		n, err := f.ReadAt(buf, off)
		off += int64(n)
		if n == 0 || errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			die("seq read: %v", err)
		}
	}
	d := time.Since(t0)
	if off != int64(*bigMiB)<<20 {
		die("seq read got %d bytes", off)
	}
	f.Close()
	return d
}

func metaStorm(root p9.File, scratch string) time.Duration {
	tree, _ := walk(root, treeName)
	if _, err := root.Mkdir(scratch, 0o755, 0, 0); err != nil {
		die("mkdir %s: %v", scratch, err)
	}
	sd, _ := walk(root, scratch)
	return parallel(*metaOps, func(i int, _ []byte) error {
		if i%4 == 3 {
			d, err := walk(sd)
			if err != nil {
				return err
			}
			name := fmt.Sprintf("n%d", i)
			f, _, _, err := d.Create(name, p9.WriteOnly, 0o644, 0, 0)
			if err != nil {
				return fmt.Errorf("meta create: %w", err)
			}
			f.Close()
			// Tremove rather than Tunlinkat: diod does not implement the latter.
			g, err := walk(sd, name)
			if err != nil {
				return fmt.Errorf("meta walk new file: %w", err)
			}
			if err := g.(interface{ Remove() error }).Remove(); err != nil {
				return fmt.Errorf("meta remove: %w", err)
			}
			return nil
		}
		k := (i * 7919) % *files
		f, err := walk(tree, fmt.Sprintf("d%03d", k/perDir), fmt.Sprintf("f%04d", k%perDir))
		if err != nil {
			return err
		}
		if _, _, _, err := f.GetAttr(p9.AttrMaskAll); err != nil {
			return fmt.Errorf("meta getattr: %w", err)
		}
		return f.Close()
	})
}

// cpuSeconds is the user+system CPU time a process has used so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are fields 14 and 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ
}

type result struct {
	manyCPU, seqCPU, metaCPU float64 // server CPU seconds (best round)
	many, seq, meta          time.Duration
	seqBig                   time.Duration // densevm only: 1 MiB msize
	rss                      string
}

func run(name, root string) result {
	best := result{many: 1 << 62, seq: 1 << 62, meta: 1 << 62, manyCPU: 1e9, seqCPU: 1e9, metaCPU: 1e9}
	s := start(name, root)
	pid := s.cmd.Process.Pid
	timed := func(fn func() time.Duration) (time.Duration, float64) {
		c0 := cpuSeconds(pid)
		d := fn()
		return d, cpuSeconds(pid) - c0
	}
	for r := 0; r < *rounds; r++ {
		c, rf := connect(s, root, uint32(*msize))
		m, mc := timed(func() time.Duration { return manyFiles(rf) })
		sq, sc := timed(func() time.Duration { return seqRead(rf) })
		mt, tc := timed(func() time.Duration { return metaStorm(rf, fmt.Sprintf("scratch-%s-%d-%d", name, os.Getpid(), r)) })
		best.manyCPU, best.seqCPU, best.metaCPU = min(best.manyCPU, mc), min(best.seqCPU, sc), min(best.metaCPU, tc)
		c.Close()
		fmt.Fprintf(os.Stderr, "bench: %s round %d: many-files %v, seq-read %v, meta-storm %v\n", name, r, m, sq, mt)
		best.many, best.seq, best.meta = min(best.many, m), min(best.seq, sq), min(best.meta, mt)
	}
	if name == "densevm" {
		c, rf := connect(s, root, 1<<20)
		best.seqBig = seqRead(rf)
		c.Close()
	}
	best.rss = s.stop()
	return best
}

func main() {
	flag.Parse()
	root, err := filepath.Abs(*dir)
	if err != nil {
		die("%v", err)
	}
	if _, err := exec.LookPath(*diodBin); err != nil {
		die("diod not found (apt-get install diod, or `make deps-9p`)")
	}
	makeTree(root)
	// Scratch dirs from earlier runs are removed so both servers see the same tree.
	old, _ := filepath.Glob(filepath.Join(root, "scratch-*"))
	for _, o := range old {
		os.RemoveAll(o)
	}
	warm(root)
	if *only != "" {
		run(*only, root)
		return
	}
	d := run("densevm", root)
	o := run("diod", root)
	rate := func(n int, t time.Duration) string { return fmt.Sprintf("%.0f/s", float64(n)/t.Seconds()) }
	mib := func(t time.Duration) string { return fmt.Sprintf("%.0f MiB/s", float64(*bigMiB)/t.Seconds()) }
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | densevm | diod | densevm / diod |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| many-files: walk+open+read+clunk, %d files, %d concurrent | %s (%.2f s) | %s (%.2f s) | **%.2fx** |\n",
		*files, *workers, rate(*files, d.many), d.many.Seconds(), rate(*files, o.many), o.many.Seconds(), o.many.Seconds()/d.many.Seconds())
	fmt.Fprintf(&b, "| seq-read: %d MiB, 1 stream, msize %d | %s | %s | %.2fx |\n",
		*bigMiB, *msize, mib(d.seq), mib(o.seq), o.seq.Seconds()/d.seq.Seconds())
	fmt.Fprintf(&b, "| seq-read, msize 1 MiB (diod cannot) | %s | - | |\n", mib(d.seqBig))
	fmt.Fprintf(&b, "| meta-storm: %d ops (3/4 walk+getattr+clunk, 1/4 create+clunk+walk+remove), %d concurrent | %s | %s | %.2fx |\n",
		*metaOps, *workers, rate(*metaOps, d.meta), rate(*metaOps, o.meta), o.meta.Seconds()/d.meta.Seconds())
	cpu := func(what string, n int, dc, oc float64) {
		fmt.Fprintf(&b, "| server CPU, %s | %.1f µs/op (%.2f s) | %.1f µs/op (%.2f s) | **%.2fx** |\n",
			what, dc/float64(n)*1e6, dc, oc/float64(n)*1e6, oc, oc/max(dc, 0.01))
	}
	cpu("many-files", *files, d.manyCPU, o.manyCPU)
	cpu("seq-read (per MiB)", *bigMiB, d.seqCPU, o.seqCPU)
	cpu("meta-storm", *metaOps, d.metaCPU, o.metaCPU)
	fmt.Fprintf(&b, "| server peak RSS (VmHWM) | %s | %s | |\n", d.rss, o.rss)
	fmt.Print(b.String())
	if *outPath != "" {
		os.MkdirAll(filepath.Dir(*outPath), 0o755)
		if err := os.WriteFile(*outPath, []byte(b.String()), 0o644); err != nil {
			die("%v", err)
		}
	}
}
