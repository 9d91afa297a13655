package ninep

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

// makeHostTree writes a deterministic tree of dirs/files under root.
func makeHostTree(t testing.TB, root string, dirs, filesPerDir int) map[string][]byte {
	t.Helper()
	r := rand.New(rand.NewSource(42))
	want := map[string][]byte{}
	for d := 0; d < dirs; d++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", d), "sub")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := 0; f < filesPerDir; f++ {
			data := make([]byte, r.Intn(9000))
			r.Read(data)
			rel := filepath.Join(fmt.Sprintf("d%03d", d), "sub", fmt.Sprintf("f%03d", f))
			if err := os.WriteFile(filepath.Join(root, rel), data, 0o644); err != nil {
				t.Fatal(err)
			}
			want[rel] = data
		}
	}
	return want
}

// TestTreeCopy copies a host tree into the export through 9p (mkdir,
// lcreate, write), then reads every file back through 9p and on the host.
func TestTreeCopy(t *testing.T) {
	src := t.TempDir()
	want := makeHostTree(t, src, 8, 40)
	s := startServer(t, "")
	_, root := s.connect(t)
	dirs := map[string]p9.File{".": root}
	var getDir func(rel string) p9.File
	getDir = func(rel string) p9.File {
		if d, ok := dirs[rel]; ok {
			return d
		}
		parent := getDir(filepath.Dir(rel))
		if _, err := parent.Mkdir(filepath.Base(rel), 0o755, 0, 0); err != nil {
			t.Fatalf("mkdir %s: %v", rel, err)
		}
		d, err := walk(parent, filepath.Base(rel))
		if err != nil {
			t.Fatalf("walk %s: %v", rel, err)
		}
		dirs[rel] = d
		return d
	}
	for rel, data := range want {
		d := getDir(filepath.Dir(rel))
		nd, err := walk(d)
		if err != nil {
			t.Fatal(err)
		}
		f, _, _, err := nd.Create(filepath.Base(rel), p9.WriteOnly, 0o644, 0, 0)
		if err != nil {
			t.Fatalf("create %s: %v", rel, err)
		}
		if n, err := f.WriteAt(data, 0); err != nil || n != len(data) {
			t.Fatalf("write %s: %d %v", rel, n, err)
		}
		f.Close()
	}
	for rel, data := range want {
		host, err := os.ReadFile(filepath.Join(s.Root, rel))
		if err != nil || !bytes.Equal(host, data) {
			t.Fatalf("host copy of %s differs (%v)", rel, err)
		}
		f, err := walk(root, splitPath(rel)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Open(p9.ReadOnly); err != nil {
			t.Fatal(err)
		}
		got, err := readAll(f)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("9p read of %s differs (%d vs %d bytes, %v)", rel, len(got), len(data), err)
		}
		f.Close()
	}
}

func splitPath(rel string) []string {
	return filepathSplit(filepath.Clean(rel))
}

func filepathSplit(p string) []string {
	dir, file := filepath.Split(p)
	if dir == "" {
		return []string{file}
	}
	return append(filepathSplit(filepath.Clean(dir)), file)
}

// TestFindWalk lists the tree recursively through Treaddir and compares
// with the host's view, including symlinks and hidden names.
func TestFindWalk(t *testing.T) {
	root := t.TempDir()
	makeHostTree(t, root, 5, 30)
	os.Symlink("d000/sub/f000", filepath.Join(root, "link"))
	os.WriteFile(filepath.Join(root, ".hidden"), []byte("x"), 0o600)
	var hostNames []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p != root {
			rel, _ := filepath.Rel(root, p)
			hostNames = append(hostNames, rel)
		}
		return nil
	})
	s := startServer(t, root)
	_, r := s.connect(t)
	var got []string
	var visit func(d p9.File, prefix string)
	visit = func(d p9.File, prefix string) {
		od, err := walk(d)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := od.Open(p9.ReadOnly); err != nil {
			t.Fatalf("open dir %q: %v", prefix, err)
		}
		ents, err := readdirAll(od)
		od.Close()
		if err != nil {
			t.Fatalf("readdir %q: %v", prefix, err)
		}
		for _, e := range ents {
			if e.Name == "." || e.Name == ".." {
				continue
			}
			rel := filepath.Join(prefix, e.Name)
			got = append(got, rel)
			if e.QID.Type == p9.TypeDir {
				c, err := walk(d, e.Name)
				if err != nil {
					t.Fatal(err)
				}
				visit(c, rel)
				c.Close()
			}
		}
	}
	visit(r, "")
	sort.Strings(got)
	sort.Strings(hostNames)
	if fmt.Sprint(got) != fmt.Sprint(hostNames) {
		t.Fatalf("9p listing (%d names) differs from host (%d names)", len(got), len(hostNames))
	}
}

// TestStatStorm runs concurrent walk+getattr on many files and checks every
// size against the host.
func TestStatStorm(t *testing.T) {
	root := t.TempDir()
	want := makeHostTree(t, root, 4, 50)
	var rels []string
	for rel := range want {
		rels = append(rels, rel)
	}
	s := startServer(t, root)
	_, r := s.connect(t)
	var wg sync.WaitGroup
	var failures atomic.Int64
	var ops atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				rel := rels[(g*7919+i*31)%len(rels)]
				f, err := walk(r, splitPath(rel)...)
				if err != nil {
					failures.Add(1)
					continue
				}
				_, _, a, err := f.GetAttr(p9.AttrMaskAll)
				if err != nil || a.Size != uint64(len(want[rel])) || !p9.FileMode(a.Mode).IsRegular() {
					failures.Add(1)
				}
				f.Close()
				ops.Add(1)
			}
		}(g)
	}
	wg.Wait()
	if failures.Load() != 0 || ops.Load() != 4000 {
		t.Fatalf("stat storm: %d failures, %d ops", failures.Load(), ops.Load())
	}
}

// TestRenameUnlinkRace has goroutines renaming, unlinking and re-creating
// the same names while others stat them; every error must be a clean errno
// and the server must keep serving.
func TestRenameUnlinkRace(t *testing.T) {
	s := startServer(t, "")
	_, r := s.connect(t)
	for i := 0; i < 16; i++ {
		os.WriteFile(filepath.Join(s.Root, fmt.Sprintf("a%d", i)), []byte("data"), 0o644)
	}
	var wg sync.WaitGroup
	var unexpected atomic.Value
	clean := func(err error) {
		if err == nil {
			return
		}
		var e linux.Errno
		if !errors.As(err, &e) || (e != linux.ENOENT && e != linux.EEXIST && e != linux.EBADF) {
			unexpected.Store(err)
		}
	}
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				n := (g + i) % 16
				a, b := fmt.Sprintf("a%d", n), fmt.Sprintf("b%d", n)
				switch (g + i) % 4 {
				case 0:
					clean(r.RenameAt(a, r, b))
				case 1:
					clean(r.RenameAt(b, r, a))
				case 2:
					clean(r.UnlinkAt(a, 0))
					nd, err := walk(r)
					if err != nil {
						unexpected.Store(err)
						continue
					}
					f, _, _, err := nd.Create(a, p9.WriteOnly, 0o644, 0, 0)
					clean(err)
					if err == nil {
						f.Close()
					} else {
						nd.Close()
					}
				default:
					f, err := walk(r, a)
					if err == nil {
						_, _, _, err = f.GetAttr(p9.AttrMaskAll)
						clean(err)
						f.Close()
					}
				}
			}
		}(g)
	}
	wg.Wait()
	if e := unexpected.Load(); e != nil {
		t.Fatalf("unexpected error during races: %v", e)
	}
	// Still serving, and the tree is consistent with the host.
	d, err := walk(r)
	if err != nil {
		t.Fatalf("server no longer serving after races: %v", err)
	}
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	ents, err := readdirAll(d)
	hostEnts, _ := os.ReadDir(s.Root)
	if err != nil || len(ents) != len(hostEnts)+2 {
		t.Fatalf("after races: 9p lists %d entries, host %d (+2 dots): %v", len(ents), len(hostEnts), err)
	}
}

// TestOpenUnlinkFstat: a file unlinked while open keeps working through its fid.
func TestOpenUnlinkFstat(t *testing.T) {
	s := startServer(t, "")
	_, r := s.connect(t)
	d, _ := walk(r)
	f, _, _, err := d.Create("victim", p9.ReadWrite, 0o600, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("hello"), 0)
	if err := r.UnlinkAt("victim", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "victim")); !os.IsNotExist(err) {
		t.Fatalf("victim still on the host: %v", err)
	}
	_, _, a, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil || a.NLink != 0 || a.Size != 5 {
		t.Fatalf("getattr after unlink: nlink=%d size=%d err=%v", a.NLink, a.Size, err)
	}
	if _, err := f.WriteAt([]byte(" world"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 8}); err != nil {
		t.Fatalf("ftruncate of unlinked file: %v", err)
	}
	got, err := readAll(f)
	if err != nil || string(got) != "hello wo" {
		t.Fatalf("read after unlink: %q %v", got, err)
	}
	if _, err := walk(r, "victim"); err == nil {
		t.Fatal("walk found the unlinked name")
	}
}

// TestJail: no escape through "..", absolute or relative symlinks.
func TestJail(t *testing.T) {
	outer := t.TempDir()
	root := filepath.Join(outer, "export")
	os.MkdirAll(filepath.Join(root, "dir"), 0o755)
	os.WriteFile(filepath.Join(outer, "secret"), []byte("s"), 0o600)
	os.Symlink("/", filepath.Join(root, "abs"))
	os.Symlink("../secret", filepath.Join(root, "rel"))
	os.Symlink("../..", filepath.Join(root, "dir", "up"))
	s := startServer(t, root)
	_, r := s.connect(t)
	rq, _, _, _ := r.GetAttr(p9.AttrMaskAll)
	up, err := walk(r, "..", "..", "dir", "..", "..")
	if err != nil {
		t.Fatal(err)
	}
	uq, _, _, _ := up.GetAttr(p9.AttrMaskAll)
	if uq.Path != rq.Path {
		t.Fatalf(".. escaped the root: qid %v vs root %v", uq, rq)
	}
	for _, path := range [][]string{{"abs", "etc"}, {"rel"}, {"dir", "up", "secret"}} {
		f, err := walk(r, path...)
		if err != nil {
			continue
		}
		// A symlink itself may be walked to, but never opened or followed.
		if _, _, err := f.Open(p9.ReadOnly); err == nil {
			t.Fatalf("opened %v outside the export", path)
		}
	}
	if _, err := walk(r, "abs", "etc"); err == nil {
		t.Fatal("walked through an absolute symlink")
	}
	if _, err := walk(r, "dir", "up", "secret"); err == nil {
		t.Fatal("walked through a relative symlink out of the export")
	}
}

// TestReadonly: a read-only export refuses every change.
func TestReadonly(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o644)
	s := startServer(t, root, "--readonly")
	_, r := s.connect(t)
	nd, _ := walk(r)
	if _, _, _, err := nd.Create("new", p9.WriteOnly, 0o644, 0, 0); !errors.Is(err, linux.EROFS) {
		t.Fatalf("create on read-only export: %v", err)
	}
	f, _ := walk(r, "f")
	if _, _, err := f.Open(p9.ReadWrite); !errors.Is(err, linux.EROFS) {
		t.Fatalf("open rw on read-only export: %v", err)
	}
	if err := r.UnlinkAt("f", 0); !errors.Is(err, linux.EROFS) {
		t.Fatalf("unlink on read-only export: %v", err)
	}
	g, _ := walk(r, "f")
	if _, _, err := g.Open(p9.ReadOnly); err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	if b, err := readAll(g); err != nil || string(b) != "x" {
		t.Fatalf("read: %q %v", b, err)
	}
}

// TestLinksAndSymlinks: link, symlink, readlink, mknod(fifo), rename of an open file.
func TestLinksAndSymlinks(t *testing.T) {
	s := startServer(t, "")
	_, r := s.connect(t)
	d, _ := walk(r)
	f, _, _, err := d.Create("orig", p9.WriteOnly, 0o644, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("abc"), 0)
	if err := r.Link(f, "hard"); err != nil {
		t.Fatalf("link: %v", err)
	}
	if _, err := r.Symlink("orig", "soft", 0, 0); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	l, _ := walk(r, "soft")
	if tgt, err := l.Readlink(); err != nil || tgt != "orig" {
		t.Fatalf("readlink: %q %v", tgt, err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Root, "hard")); string(b) != "abc" {
		t.Fatalf("hard link content %q", b)
	}
	if _, err := r.Mknod("fifo", p9.ModeNamedPipe|0o644, 0, 0, 0, 0); err != nil {
		t.Fatalf("mknod fifo: %v", err)
	}
	if _, err := r.Mknod("dev", p9.ModeBlockDevice|0o644, 8, 0, 0, 0); err == nil {
		t.Fatal("mknod of a block device was allowed")
	}
	sub, _ := r.Mkdir("sub", 0o755, 0, 0)
	_ = sub
	sd, _ := walk(r, "sub")
	if err := f.Rename(sd, "moved"); err != nil {
		t.Fatalf("rename: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Root, "sub", "moved")); err != nil {
		t.Fatalf("renamed file missing: %v", err)
	}
	if _, err := f.WriteAt([]byte("d"), 3); err != nil {
		t.Fatalf("write after rename: %v", err)
	}
	st, err := r.StatFS()
	if err != nil || st.BlockSize == 0 {
		t.Fatalf("statfs: %+v %v", st, err)
	}
}
