// Command bench compares `densevm 9p serve` with diod in one run, with the
// same userspace 9P2000.L client (github.com/hugelgupf/p9) over loopback TCP:
//
//   - many-files: walk+open+read+clunk of every file of a ~100k-file tree
//   - seq-read:   one 1 GiB file read sequentially
//   - meta-storm: walk+getattr+clunk of random files, plus create+unlink
//
// The tree is generated once and cached under -dir. Results go to -out as a
// markdown table (medians of -rounds alternating rounds per server, peak RSS).
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
	"sort"
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
	baseline  = flag.String("baseline", "", "another densevm binary (e.g. main's) run in the same rotation; its CPU is reported as \"densevm baseline\"")
	dir       = flag.String("dir", "build/9p-bench", "cache directory for the generated tree")
	files     = flag.Int("files", 100000, "number of small files")
	bigMiB    = flag.Int("big-mib", 1024, "size of the sequential-read file in MiB")
	workers   = flag.Int("c", 8, "client goroutines (concurrent requests)")
	rounds    = flag.Int("rounds", 3, "rounds per server, alternating between the servers (medians are reported)")
	passes    = flag.Int("passes", 1, "many-files: times every file is walked+opened+read+clunked per round")
	workloads = flag.String("workloads", "many,seq,meta", "comma-separated workloads to run: many, seq, meta")
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
	case "baseline":
		cmd = exec.Command(*baseline, "9p", "serve", root, "--listen", "tcp:"+addr)
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
	return parallel(*files**passes, func(i int, buf []byte) error {
		i %= *files
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

type sample struct {
	wall time.Duration
	cpu  float64 // server CPU seconds (user+system, /proc/PID/stat)
}

// result holds every round's samples of one server.
type result struct {
	many, seq, meta []sample
	seqBig          time.Duration // densevm only: 1 MiB msize
	rss             string
}

// median of the samples (by wall time, or by CPU time when cpu is set).
func median(xs []sample, cpu bool) sample {
	if len(xs) == 0 {
		return sample{}
	}
	ys := append([]sample(nil), xs...)
	sort.Slice(ys, func(i, j int) bool {
		if cpu {
			return ys[i].cpu < ys[j].cpu
		}
		return ys[i].wall < ys[j].wall
	})
	return ys[len(ys)/2]
}

func enabled(w string) bool {
	for _, x := range strings.Split(*workloads, ",") {
		if strings.TrimSpace(x) == w {
			return true
		}
	}
	return false
}

// round runs one round of every enabled workload against s on a fresh connection.
func (s *server) round(root string, r int, res *result) {
	pid := s.cmd.Process.Pid
	timed := func(fn func() time.Duration) sample {
		c0 := cpuSeconds(pid)
		d := fn()
		return sample{d, cpuSeconds(pid) - c0}
	}
	c, rf := connect(s, root, uint32(*msize))
	var line strings.Builder
	if enabled("many") {
		m := timed(func() time.Duration { return manyFiles(rf) })
		res.many = append(res.many, m)
		fmt.Fprintf(&line, " many-files %v (cpu %.2f s)", m.wall, m.cpu)
	}
	if enabled("seq") {
		m := timed(func() time.Duration { return seqRead(rf) })
		res.seq = append(res.seq, m)
		fmt.Fprintf(&line, " seq-read %v (cpu %.2f s)", m.wall, m.cpu)
	}
	if enabled("meta") {
		m := timed(func() time.Duration { return metaStorm(rf, fmt.Sprintf("scratch-%s-%d-%d", s.name, os.Getpid(), r)) })
		res.meta = append(res.meta, m)
		fmt.Fprintf(&line, " meta-storm %v (cpu %.2f s)", m.wall, m.cpu)
	}
	c.Close()
	fmt.Fprintf(os.Stderr, "bench: %s round %d:%s\n", s.name, r, line.String())
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
	names := []string{"densevm", "diod"}
	if *only != "" {
		names = []string{*only}
	} else if *baseline != "" {
		names = append(names, "baseline")
	}
	// Both servers run for the whole benchmark (an idle server costs nothing) and
	// the rounds alternate between them, so that a burst of load from other
	// users of the machine hits both rather than one.
	servers := make([]*server, len(names))
	results := make([]result, len(names))
	for i, n := range names {
		servers[i] = start(n, root)
	}
	for r := 0; r < *rounds; r++ {
		for k := range servers {
			i := k
			if r%2 == 1 {
				i = len(servers) - 1 - k
			}
			servers[i].round(root, r, &results[i])
		}
	}
	for i, n := range names {
		if n != "diod" && enabled("seq") {
			c, rf := connect(servers[i], root, 1<<20)
			results[i].seqBig = seqRead(rf)
			c.Close()
		}
	}
	for i := range servers {
		results[i].rss = servers[i].stop()
	}
	if *only != "" {
		return
	}
	d, o := results[0], results[1]
	nmany := *files * *passes
	rate := func(n int, t time.Duration) string { return fmt.Sprintf("%.0f/s", float64(n)/t.Seconds()) }
	mib := func(t time.Duration) string { return fmt.Sprintf("%.0f MiB/s", float64(*bigMiB)/t.Seconds()) }
	var b strings.Builder
	fmt.Fprintf(&b, "Medians of %d rounds per server, alternating; throughput ratio = diod time / densevm time (higher is better), CPU ratio = densevm CPU / diod CPU (lower is better).\n\n", *rounds)
	fmt.Fprintf(&b, "| workload | densevm | diod | ratio |\n|---|---|---|---|\n")
	if enabled("many") {
		dm, om := median(d.many, false), median(o.many, false)
		fmt.Fprintf(&b, "| many-files: walk+open+read+clunk, %d files x %d passes, %d concurrent | %s (%.2f s) | %s (%.2f s) | %.2fx |\n",
			*files, *passes, *workers, rate(nmany, dm.wall), dm.wall.Seconds(), rate(nmany, om.wall), om.wall.Seconds(), om.wall.Seconds()/dm.wall.Seconds())
	}
	if enabled("seq") {
		dm, om := median(d.seq, false), median(o.seq, false)
		fmt.Fprintf(&b, "| seq-read: %d MiB, 1 stream, msize %d | %s | %s | %.2fx |\n",
			*bigMiB, *msize, mib(dm.wall), mib(om.wall), om.wall.Seconds()/dm.wall.Seconds())
		fmt.Fprintf(&b, "| seq-read, msize 1 MiB (diod cannot) | %s | - | |\n", mib(d.seqBig))
		if len(results) > 2 {
			fmt.Fprintf(&b, "| seq-read, msize 1 MiB, densevm baseline | %s | - | |\n", mib(results[2].seqBig))
		}
	}
	if enabled("meta") {
		dm, om := median(d.meta, false), median(o.meta, false)
		fmt.Fprintf(&b, "| meta-storm: %d ops (3/4 walk+getattr+clunk, 1/4 create+clunk+walk+remove), %d concurrent | %s | %s | %.2fx |\n",
			*metaOps, *workers, rate(*metaOps, dm.wall), rate(*metaOps, om.wall), om.wall.Seconds()/dm.wall.Seconds())
	}
	cpu := func(what, unit string, n int, ds, xs []sample) {
		dc, oc := median(ds, true).cpu, median(xs, true).cpu
		fmt.Fprintf(&b, "| server CPU, %s | %.1f µs/%s (%.2f s) | %.1f µs/%s (%.2f s) | **%.2fx** |\n",
			what, dc/float64(n)*1e6, unit, dc, oc/float64(n)*1e6, unit, oc, dc/max(oc, 0.01))
		if len(results) > 2 {
			var bs []sample
			switch what {
			case "many-files":
				bs = results[2].many
			case "seq-read":
				bs = results[2].seq
			default:
				bs = results[2].meta
			}
			bc := median(bs, true).cpu
			fmt.Fprintf(&b, "| server CPU, %s, densevm baseline (%s) | %.1f µs/%s (%.2f s) | | %.2fx |\n",
				what, filepath.Base(*baseline), bc/float64(n)*1e6, unit, bc, bc/max(oc, 0.01))
		}
	}
	if enabled("many") {
		cpu("many-files", "file", nmany, d.many, o.many)
	}
	if enabled("seq") {
		cpu("seq-read", "MiB", *bigMiB, d.seq, o.seq)
	}
	if enabled("meta") {
		cpu("meta-storm", "op", *metaOps, d.meta, o.meta)
	}
	fmt.Fprintf(&b, "| server peak RSS (VmHWM) | %s | %s | |\n", d.rss, o.rss)
	if len(results) > 2 {
		fmt.Fprintf(&b, "| server peak RSS (VmHWM), densevm baseline | %s | | |\n", results[2].rss)
	}
	fmt.Print(b.String())
	if *outPath != "" {
		os.MkdirAll(filepath.Dir(*outPath), 0o755)
		if err := os.WriteFile(*outPath, []byte(b.String()), 0o644); err != nil {
			die("%v", err)
		}
	}
}
