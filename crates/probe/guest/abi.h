/* densevm probe guest ABI: shared layout between the VMM (Rust, src/abi.rs) and the
 * freestanding guest. Keep in sync with src/abi.rs; a unit test checks the numbers. */
#ifndef DENSEVM_PROBE_ABI_H
#define DENSEVM_PROBE_ABI_H

#define PROBE_LOAD_ADDR     0x100000UL  /* probe image (flat binary), entered in 64-bit mode */
#define PROBE_MAILBOX_ADDR  0x4000UL    /* SMP work mailbox (one page) */
#define PROBE_BLOCK_ADDR    0x5000UL    /* command block */
#define PROBE_BLOCK_SIZE    0x4000UL
#define PROBE_MAGIC         0x42505644U /* "DVPB" */
#define PROBE_VERSION       1U
#define PROBE_MAX_REGIONS   8
#define PROBE_REGION_NAME   16

#define PORT_SERIAL         0x3f8
#define PORT_DEBUG_EXIT     0x501       /* write: process exit code (low byte) */
#define PORT_TRACE_MARK     0x502       /* write: trace mark id (byte) */
#define PORT_PROBE_FAULT    0x503       /* write: exception vector; VM ends with an error */
#define PORT_SLEEP          0x504       /* write: sleep this many ms (byte, the VMM caps it) */
#define SLEEP_SLICE_MS      10          /* the probe sleeps in writes of at most this */
#define PORT_INSTANCE       0x505       /* read (32 bits): the VM's instance number (0 if unset) */

#define MARK_PROBE_START    0x01
#define MARK_PROBE_DONE     0x02

#define OP_TOUCH  1  /* region, offset, len: write one byte per 4 KiB page (split over CPUs) */
#define OP_WRITE  2  /* region, offset, len, byte: fill */
#define OP_SUM    3  /* region, offset, len: print checksum */
#define OP_READ   4  /* region, offset, len: read one byte per 4 KiB page */
#define OP_EXIT   5  /* a = exit code */
#define OP_MARK   6  /* a = mark id */
#define OP_CRASH  7  /* a = crash kind */
#define OP_RESET  8  /* i8042 reset: 0xfe to port 0x64 */
#define OP_SLEEP  9  /* a = milliseconds: idle on the host (sleep port), not spinning */
#define OP_FILL_ID 10 /* region, offset, len: fill with (instance + 1) & 0xff */
#define OP_FILL_ADDR 11 /* region, offset, len: each 64-bit word = its address * FILL_ADDR_MUL */
#define FILL_ADDR_MUL 0x9E3779B97F4A7C15UL

#define CRASH_TRIPLE_FAULT 1  /* load an empty IDT and raise #UD */
#define CRASH_MMIO_EXEC    2  /* jump to the end of `ram`: mapped, but no memory behind it */
#define CRASH_INT3         3  /* int3 without a handler: PVM rejects it at CPL0 */

#define MB_OP_IDLE  0
#define MB_OP_TOUCH 1
#define MB_OP_READ  2
#define MB_OP_QUIT  3

#ifndef __ASSEMBLER__
typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct probe_region {
    u64 gpa;
    u64 size;
    char name[PROBE_REGION_NAME];
};

struct probe_cmd {
    u32 op;
    u32 region;
    u64 a, b, c;
};

struct probe_block {
    u32 magic;
    u32 version;
    u32 ncpus;
    u32 nregions;
    u64 tsc_khz;
    struct probe_region regions[PROBE_MAX_REGIONS];
    u32 ncmds;
    u32 reserved;
    struct probe_cmd cmds[];
};

struct probe_mailbox {
    volatile u32 gen;
    volatile u32 op;
    volatile u64 base;
    volatile u64 len;
    volatile u32 done;
    volatile u32 online;
};
#endif
#endif
