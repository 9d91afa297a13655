// Workload suite for `densevm 9p serve`, driven by a userspace 9P2000.L
// client (github.com/hugelgupf/p9). Run with `make test-9p`, or:
//
//	DENSEVM_BIN=target/release/densevm go test ./...   (in tests/9p)
package ninep

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// densevmBin finds the densevm binary; the test fails (never skips) without it.
func densevmBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("DENSEVM_BIN")
	if bin == "" {
		bin = "../../target/release/densevm"
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("densevm binary missing at %s (run `make build` or set DENSEVM_BIN): %v", abs, err)
	}
	return abs
}

// server is one running `densevm 9p serve` process.
type server struct {
	Root string
	Sock string
	cmd  *exec.Cmd
}

// startServer exports a fresh temporary directory (or root, if non-empty).
func startServer(t testing.TB, root string, extra ...string) *server {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	sock := filepath.Join(t.TempDir(), "9p.sock")
	args := append([]string{"9p", "serve", root, "--listen", "unix:" + sock}, extra...)
	cmd := exec.Command(densevmBin(t), args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting densevm: %v", err)
	}
	s := &server{Root: root, Sock: sock, cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("densevm 9p serve did not listen on %s within 10s", sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// connect opens a client session and attaches to the export root.
func (s *server) connect(t testing.TB) (*p9.Client, p9.File) {
	t.Helper()
	conn, err := net.Dial("unix", s.Sock)
	if err != nil {
		t.Fatalf("dial %s: %v", s.Sock, err)
	}
	c, err := p9.NewClient(conn, p9.WithMessageSize(1<<20))
	if err != nil {
		t.Fatalf("Tversion: %v", err)
	}
	root, err := c.Attach("")
	if err != nil {
		t.Fatalf("Tattach: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, root
}

// walk walks a full path; a partial walk is an error.
func walk(f p9.File, names ...string) (p9.File, error) {
	qids, nf, err := f.Walk(names)
	if err != nil {
		return nil, err
	}
	if len(qids) != len(names) {
		return nil, fmt.Errorf("partial walk: %d of %d", len(qids), len(names))
	}
	return nf, nil
}

// readAll reads a whole open file.
func readAll(f p9.File) ([]byte, error) {
	var out []byte
	buf := make([]byte, 256<<10)
	for {
		n, err := f.ReadAt(buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if err != nil && !errors.Is(err, io.EOF) {
			return out, err
		}
		if n == 0 || errors.Is(err, io.EOF) {
			return out, nil
		}
	}
}

// readdirAll lists an open directory.
func readdirAll(d p9.File) ([]p9.Dirent, error) {
	var out []p9.Dirent
	var off uint64
	for {
		ents, err := d.Readdir(off, 64<<10)
		if err != nil {
			return nil, err
		}
		if len(ents) == 0 {
			return out, nil
		}
		out = append(out, ents...)
		off = ents[len(ents)-1].Offset
	}
}
