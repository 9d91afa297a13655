// kvzipf: a zipfian key-value client for Redis inside the L2 guest (issue #13's
// Redis-in-guest benchmark, lab/bench/redis-tier.sh). redis-benchmark draws keys
// uniformly (-r), so this client speaks RESP itself to draw them as YCSB does.
//
//   kvzipf load  N VLEN             SET k00000000..N-1, VLEN-byte values, version 0
//   kvzipf run   N VLEN WARMUP SECS SEED
//                                   YCSB-B: 95 % GET, 5 % SET of the whole value; keys
//                                   zipfian, theta 0.99 (Gray et al.'s generator, as
//                                   YCSB's), rank r -> key (r * 2654435761 + 12345) mod N
//                                   (N a power of two: a bijection that spreads hot keys
//                                   over Redis's memory); every GET is compared with the
//                                   value its key's last SET wrote
//   kvzipf check N VLEN             GETs every key and compares it
//
// A value is a function of (key, version): 3/4 words from a 64-word vocabulary, 1/4
// random bytes (compresses about as the process-level benchmark's pages do). Versions live
// in /tmp/kvzipf.ver between runs. Redis at 127.0.0.1:6379. Output: one line
// "KVZIPF mode=... ops=... secs=... ops_per_s=... bad=... missing=..."; exit 1 on any
// mismatch or missing key, 2 on a usage or connection error.
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define VER_FILE "/tmp/kvzipf.ver"
#define BATCH 64

static int fd;
static char rbuf[1 << 16];
static size_t rpos, rlen;
static uint32_t *ver;

static void die(const char *what) {
  fprintf(stderr, "kvzipf: %s: %s\n", what, errno ? strerror(errno) : "protocol error");
  exit(2);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static const char *vocab[64] = {
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
    "yankee", "zulu", "memory", "budget", "tier", "page", "fault", "guest",
    "kernel", "redis", "value", "update", "read", "write", "cold", "hot",
    "swap", "compress", "density", "clone", "snapshot", "balloon", "virtio", "queue",
    "vcpu", "host", "share", "cache", "dram", "zipf", "theta", "bench",
    "server", "client", "request", "reply", "socket", "buffer", "vector", "table"};

// The value of (key, version), VLEN bytes.
static void value(uint32_t key, uint32_t v, char *out, size_t vlen) {
  uint64_t s = ((uint64_t)key << 32) ^ v ^ 0x5eed;
  size_t n = 0;
  while (n < vlen) {
    uint64_t r = splitmix(&s);
    if ((r & 3) == 0) {
      for (int i = 0; i < 8 && n < vlen; i++) out[n++] = (char)(r >> (8 * i));
    } else {
      const char *w = vocab[(r >> 8) & 63];
      while (*w && n < vlen) out[n++] = *w++;
      if (n < vlen) out[n++] = ' ';
    }
  }
}

static void send_all(const char *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("write");
    p += k;
    n -= (size_t)k;
  }
}

static int getc_r(void) {
  if (rpos == rlen) {
    ssize_t k;
    do k = read(fd, rbuf, sizeof rbuf); while (k < 0 && errno == EINTR);
    if (k <= 0) die("read");
    rpos = 0;
    rlen = (size_t)k;
  }
  return (unsigned char)rbuf[rpos++];
}

// One reply line without its CRLF into `line` (at most cap-1 bytes).
static void read_line(char *line, size_t cap) {
  size_t n = 0;
  for (;;) {
    int c = getc_r();
    if (c == '\r') {
      if (getc_r() != '\n') die("reply line");
      break;
    }
    if (n + 1 < cap) line[n++] = (char)c;
  }
  line[n] = 0;
}

static void expect_ok(void) {
  char line[256];
  read_line(line, sizeof line);
  if (strcmp(line, "+OK") != 0) {
    fprintf(stderr, "kvzipf: SET answered '%s'\n", line);
    exit(2);
  }
}

// Reads a bulk reply into out (cap bytes); returns its length, -1 for nil.
static long read_bulk(char *out, size_t cap) {
  char line[64];
  read_line(line, sizeof line);
  if (line[0] != '$') {
    fprintf(stderr, "kvzipf: GET answered '%s'\n", line);
    exit(2);
  }
  long len = strtol(line + 1, NULL, 10);
  if (len < 0) return -1;
  for (long i = 0; i < len + 2; i++) {
    int c = getc_r();
    if (i < len && (size_t)i < cap) out[i] = (char)c;
  }
  return len;
}

static char *cmd;
static size_t cmd_len;

static void add_set(uint32_t key, const char *val, size_t vlen) {
  cmd_len += (size_t)sprintf(cmd + cmd_len, "*3\r\n$3\r\nSET\r\n$9\r\nk%08u\r\n$%zu\r\n", key, vlen);
  memcpy(cmd + cmd_len, val, vlen);
  cmd_len += vlen;
  memcpy(cmd + cmd_len, "\r\n", 2);
  cmd_len += 2;
}

static void add_get(uint32_t key) {
  cmd_len += (size_t)sprintf(cmd + cmd_len, "*2\r\n$3\r\nGET\r\n$9\r\nk%08u\r\n", key);
}

static void flush_cmd(void) {
  send_all(cmd, cmd_len);
  cmd_len = 0;
}

// Zipfian ranks in [0, n), theta 0.99 (Gray et al., "Quickly generating billion-record
// synthetic databases", as YCSB's ZipfianGenerator).
struct zipf {
  double n, theta, alpha, zetan, eta, half_pow;
};

static void zipf_init(struct zipf *z, uint64_t n, double theta) {
  double zeta2 = 1 + pow(0.5, theta), zetan = 0;
  for (uint64_t i = 1; i <= n; i++) zetan += 1 / pow((double)i, theta);
  z->n = (double)n;
  z->theta = theta;
  z->alpha = 1 / (1 - theta);
  z->zetan = zetan;
  z->eta = (1 - pow(2.0 / n, 1 - theta)) / (1 - zeta2 / zetan);
  z->half_pow = pow(0.5, theta);
}

static uint64_t zipf_next(struct zipf *z, uint64_t *s) {
  double u = (splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
  double uz = u * z->zetan;
  if (uz < 1) return 0;
  if (uz < 1 + z->half_pow) return 1;
  uint64_t r = (uint64_t)(z->n * pow(z->eta * u - z->eta + 1, z->alpha));
  return r >= (uint64_t)z->n ? (uint64_t)z->n - 1 : r;
}

static void load_versions(uint32_t n) {
  ver = calloc(n, sizeof *ver);
  if (!ver) die("calloc");
  FILE *f = fopen(VER_FILE, "rb");
  if (!f) return;
  if (fread(ver, sizeof *ver, n, f) != n) {
    fprintf(stderr, "kvzipf: %s does not hold %u versions (load again)\n", VER_FILE, n);
    exit(2);
  }
  fclose(f);
}

static void save_versions(uint32_t n) {
  FILE *f = fopen(VER_FILE ".new", "wb");
  if (!f || fwrite(ver, sizeof *ver, n, f) != n || fclose(f) != 0) die("writing versions");
  if (rename(VER_FILE ".new", VER_FILE) != 0) die("rename versions");
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: kvzipf load|check N VLEN | kvzipf run N VLEN WARMUP SECS SEED\n");
    return 2;
  }
  const char *mode = argv[1];
  uint32_t n = (uint32_t)strtoul(argv[2], NULL, 10);
  size_t vlen = strtoul(argv[3], NULL, 10);
  int run = strcmp(mode, "run") == 0;
  if (n == 0 || (n & (n - 1)) || vlen == 0 || vlen > 65536 || (run && argc < 7) ||
      (!run && strcmp(mode, "load") && strcmp(mode, "check"))) {
    fprintf(stderr, "kvzipf: N must be a power of two, 0 < VLEN <= 65536; modes load, run, check\n");
    return 2;
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(6379)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect 127.0.0.1:6379");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  cmd = malloc(BATCH * (vlen + 64));
  char *want = malloc(vlen), *got = malloc(vlen);
  if (!cmd || !want || !got) die("malloc");
  unsigned long ops = 0, bad = 0, missing = 0, reads = 0, updates = 0;
  double t0 = now(), secs;

  if (strcmp(mode, "load") == 0) {
    ver = calloc(n, sizeof *ver);
    if (!ver) die("calloc");
    for (uint32_t k = 0; k < n; k += BATCH) {
      uint32_t m = n - k < BATCH ? n - k : BATCH;
      for (uint32_t i = 0; i < m; i++) {
        value(k + i, 0, want, vlen);
        add_set(k + i, want, vlen);
      }
      flush_cmd();
      for (uint32_t i = 0; i < m; i++) expect_ok();
      ops += m;
    }
    save_versions(n);
    secs = now() - t0;
  } else if (strcmp(mode, "check") == 0) {
    load_versions(n);
    for (uint32_t k = 0; k < n; k += BATCH) {
      uint32_t m = n - k < BATCH ? n - k : BATCH;
      for (uint32_t i = 0; i < m; i++) add_get(k + i);
      flush_cmd();
      for (uint32_t i = 0; i < m; i++) {
        long len = read_bulk(got, vlen);
        value(k + i, ver[k + i], want, vlen);
        if (len < 0) missing++;
        else if ((size_t)len != vlen || memcmp(got, want, vlen) != 0) bad++;
      }
      ops += m;
    }
    secs = now() - t0;
  } else {
    double warmup = atof(argv[4]), dur = atof(argv[5]);
    uint64_t s = strtoull(argv[6], NULL, 10) * 0x9e3779b97f4a7c15ULL + 1;
    struct zipf z;
    load_versions(n);
    zipf_init(&z, n, 0.99);
    double start = now(), end = start + warmup + dur;
    int measuring = warmup <= 0;
    if (measuring) t0 = start;
    for (;;) {
      // Check the clock every 64 operations.
      if ((ops & 63) == 0) {
        double t = now();
        if (!measuring && t >= start + warmup) {
          measuring = 1;
          t0 = t;
          ops = reads = updates = 0;
        }
        if (t >= end) break;
      }
      uint32_t key = (uint32_t)((zipf_next(&z, &s) * 2654435761ULL + 12345) & (n - 1));
      if (splitmix(&s) % 100 < 5) {
        value(key, ver[key] + 1, want, vlen);
        add_set(key, want, vlen);
        flush_cmd();
        expect_ok();
        ver[key]++;
        updates++;
      } else {
        add_get(key);
        flush_cmd();
        long len = read_bulk(got, vlen);
        value(key, ver[key], want, vlen);
        if (len < 0) missing++;
        else if ((size_t)len != vlen || memcmp(got, want, vlen) != 0) bad++;
        reads++;
      }
      ops++;
    }
    secs = now() - t0;
    save_versions(n);
  }
  printf("KVZIPF mode=%s keys=%u vlen=%zu ops=%lu reads=%lu updates=%lu secs=%.3f ops_per_s=%.1f bad=%lu missing=%lu\n",
         mode, n, vlen, ops, reads, updates, secs, secs > 0 ? ops / secs : 0.0, bad, missing);
  return bad || missing ? 1 : 0;
}
