/* rio: 4 KiB random I/O at queue depth 1 for the L2 guest (no fio in the initrd).
 *   rio read|write DEVICE SIZE_MIB SECONDS
 * Opens DEVICE with O_DIRECT and, for SECONDS, reads or writes 4 KiB blocks at random
 * 4 KiB-aligned offsets below SIZE_MIB MiB (xorshift, fixed seed, so every run and every
 * VMM sees the same offsets). Prints one line:
 *   rio MODE ops=N secs=S iops=I kib_s=K
 * Built by lab/guest/build.sh into the tools initrd (build/guest/initrd-tools.cpio.gz). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc != 5 || (strcmp(argv[1], "read") && strcmp(argv[1], "write"))) {
    fprintf(stderr, "usage: rio read|write DEVICE SIZE_MIB SECONDS\n");
    return 2;
  }
  int writing = argv[1][0] == 'w';
  uint64_t blocks = strtoull(argv[3], NULL, 10) * 256;
  double secs = atof(argv[4]);
  if (blocks == 0 || secs <= 0) {
    fprintf(stderr, "rio: SIZE_MIB and SECONDS must be positive\n");
    return 2;
  }
  int fd = open(argv[2], (writing ? O_WRONLY : O_RDONLY) | O_DIRECT);
  if (fd < 0) {
    perror(argv[2]);
    return 1;
  }
  void *buf;
  if (posix_memalign(&buf, 4096, 4096)) return 1;
  memset(buf, 0x5a, 4096);
  uint64_t x = 88172645463325252ull, ops = 0;
  double start = now(), end = start + secs, t = start;
  while (t < end) {
    for (int i = 0; i < 16; i++) { /* read the clock every 16 ops */
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      off_t off = (off_t)(x % blocks) * 4096;
      ssize_t n = writing ? pwrite(fd, buf, 4096, off) : pread(fd, buf, 4096, off);
      if (n != 4096) {
        perror("rio: I/O");
        return 1;
      }
      ops++;
    }
    t = now();
  }
  if (writing && fdatasync(fd)) {
    perror("rio: fdatasync");
    return 1;
  }
  t = now() - start;
  printf("rio %s ops=%llu secs=%.2f iops=%.0f kib_s=%.0f\n", argv[1], (unsigned long long)ops, t,
         ops / t, ops * 4.0 / t);
  return 0;
}
