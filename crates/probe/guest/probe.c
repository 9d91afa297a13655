/* densevm probe guest: a freestanding workload runner for VMM tests.
 * It reads the command block the VMM prepared (abi.h), runs each command, reports
 * results on the serial port and ends by writing the exit code to the debug-exit port.
 * It runs in guest kernel mode. Under PVM-style KVM (this project's test hosts) guest
 * kernel-mode code of a non-PVM guest is emulated, so each memory access costs
 * microseconds there; user mode would run natively but PVM does not deliver `int N`
 * or a plain `syscall` back to a non-PVM guest kernel. Timings from PVM hosts are for
 * ratios within one run only.
 * Only plain integer instructions are used: PVM's emulator rejects some (cmpxchg16b,
 * xrstor, int3) at CPL0, and the VMM does not enable SSE state for the probe. */
#include "abi.h"

static inline void outb(u32 port, u8 v) { __asm__ volatile("outb %0, %w1" ::"a"(v), "Nd"(port)); }
static inline u32 inl(u32 port) {
    u32 v;
    __asm__ volatile("inl %w1, %0" : "=a"(v) : "Nd"(port));
    return v;
}
static inline u64 rdtsc(void) {
    u32 lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((u64)hi << 32) | lo;
}
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }
static inline u32 atomic_inc(volatile u32 *p) {
    u32 v = 1;
    __asm__ volatile("lock xaddl %0, %1" : "+r"(v), "+m"(*p) :: "memory");
    return v;
}

static volatile u32 serial_lock;
static void lock(void) {
    for (;;) {
        u32 v = 1;
        __asm__ volatile("xchgl %0, %1" : "+r"(v), "+m"(serial_lock) :: "memory");
        if (!v) return;
        cpu_relax();
    }
}
static void unlock(void) { __asm__ volatile("" ::: "memory"); serial_lock = 0; }

static void puts_raw(const char *s) { while (*s) outb(PORT_SERIAL, (u8)*s++); }
static void put_hex(u64 v, int digits) {
    char buf[17];
    for (int i = digits - 1; i >= 0; i--) { buf[i] = "0123456789abcdef"[v & 15]; v >>= 4; }
    buf[digits] = 0;
    puts_raw(buf);
}
static void put_dec(u64 v) {
    char buf[21]; int i = 20; buf[i] = 0;
    do { buf[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    puts_raw(buf + i);
}
static void put_size(u64 v) {
    if (v && !(v & ((1UL << 30) - 1))) { put_dec(v >> 30); puts_raw("G"); }
    else if (v && !(v & ((1UL << 20) - 1))) { put_dec(v >> 20); puts_raw("M"); }
    else if (v && !(v & ((1UL << 10) - 1))) { put_dec(v >> 10); puts_raw("K"); }
    else put_dec(v);
}

struct idt_entry { unsigned short off0, sel; u8 ist, type; unsigned short off1; u32 off2, zero; };
static struct idt_entry idt[22];
extern const u64 exc_table[22];

static void load_idt(void) {
    if (!idt[0].sel) {
        for (int i = 0; i < 22; i++) {
            u64 a = exc_table[i];
            idt[i].off0 = (unsigned short)a; idt[i].sel = 0x08; idt[i].ist = 0; idt[i].type = 0x8e;
            idt[i].off1 = (unsigned short)(a >> 16); idt[i].off2 = (u32)(a >> 32); idt[i].zero = 0;
        }
    }
    struct { unsigned short limit; u64 base; } __attribute__((packed)) d = { sizeof(idt) - 1, (u64)idt };
    __asm__ volatile("lidt %0" :: "m"(d));
}

static u64 tsc_khz;
static u64 us_since(u64 t0) { return tsc_khz ? (rdtsc() - t0) * 1000 / tsc_khz : 0; }

/* Per-page workloads shared with the APs: [base, base+len) is split in ncpus slices. */
static void page_slice(u32 op, u64 base, u64 len, u32 cpu, u32 ncpus) {
    u64 pages = len >> 12, per = pages / ncpus, first = per * cpu;
    u64 count = cpu == ncpus - 1 ? pages - first : per;
    volatile u8 *p = (volatile u8 *)(base + (first << 12));
    if (op == MB_OP_TOUCH) {
        for (u64 i = 0; i < count; i++) p[i << 12] = (u8)(i | 1);
    } else {
        u8 acc = 0;
        for (u64 i = 0; i < count; i++) acc ^= p[i << 12];
        (void)acc;
    }
}

static void ap_loop(struct probe_mailbox *mb, u32 cpu, u32 ncpus) {
    u32 seen = 0;
    atomic_inc(&mb->online);
    for (;;) {
        while (mb->gen == seen) cpu_relax();
        seen = mb->gen;
        if (mb->op == MB_OP_QUIT) return;
        page_slice(mb->op, mb->base, mb->len, cpu, ncpus);
        atomic_inc(&mb->done);
    }
}

static void run_parallel(struct probe_mailbox *mb, u32 op, u64 base, u64 len, u32 ncpus) {
    if (ncpus > 1) {
        mb->op = op; mb->base = base; mb->len = len; mb->done = 0;
        __asm__ volatile("" ::: "memory");
        atomic_inc(&mb->gen);
    }
    page_slice(op, base, len, 0, ncpus);
    if (ncpus > 1)
        while (mb->done != ncpus - 1) cpu_relax();
}

static u64 checksum(const volatile u8 *p, u64 len) {
    u64 h = 0xcbf29ce484222325UL, i = len / 64 * 64, blocks = len / 64;
    const u64 prime = 0x100000001b3UL;
    if (blocks) {
        /* The same FNV-1a over 64-bit words as below, 8 words a turn: 2 instructions a word
           instead of ~6 (this host's KVM emulates every instruction of the probe). */
        const void *s = (const void *)p;
        __asm__ volatile(
            "1:\n\t"
            ".set off, 0\n\t"
            ".rept 8\n\t"
            "xorq off(%[s]), %[h]\n\t"
            "imulq %[m], %[h]\n\t"
            ".set off, off + 8\n\t"
            ".endr\n\t"
            "addq $64, %[s]\n\t"
            "decq %[n]\n\t"
            "jnz 1b"
            : [h] "+r"(h), [s] "+r"(s), [n] "+r"(blocks)
            : [m] "r"(prime)
            : "cc", "memory");
    }
    for (; i + 8 <= len; i += 8) { h ^= *(const volatile u64 *)(p + i); h *= prime; }
    if (i < len) {
        u64 w = 0;
        for (u64 k = 0; i + k < len; k++) w |= (u64)p[i + k] << (8 * k);
        h ^= w; h *= prime;
    }
    return h;
}

/* `rep stosq`: KVM's emulator runs its iterations without decoding each again, ~10x
   faster here than a loop of stores. */
static void fill(volatile u8 *p, u64 len, u8 byte) {
    u64 w = byte * 0x0101010101010101UL, words = len / 8, i = words * 8;
    void *d = (void *)p;
    __asm__ volatile("rep stosq" : "+D"(d), "+c"(words) : "a"(w) : "memory");
    for (; i < len; i++) p[i] = byte;
}

/* Every word differs from every other (and does not compress): a page read back from
   the wrong place, or not at all, changes the checksum. */
static void fill_addr(volatile u8 *p, u64 len) {
    u64 i = len / 64 * 64, blocks = len / 64;
    if (blocks) {
        /* Word k of the range holds (p + 8k) * MUL = the previous word's + 8 * MUL
           (wrapping): 8 words a turn, 2 instructions a word. */
        u64 v = (u64)p * FILL_ADDR_MUL, step = 8 * FILL_ADDR_MUL;
        void *d = (void *)p;
        __asm__ volatile(
            "1:\n\t"
            ".set off, 0\n\t"
            ".rept 8\n\t"
            "movq %[v], off(%[d])\n\t"
            "addq %[st], %[v]\n\t"
            ".set off, off + 8\n\t"
            ".endr\n\t"
            "addq $64, %[d]\n\t"
            "decq %[n]\n\t"
            "jnz 1b"
            : [v] "+r"(v), [d] "+r"(d), [n] "+r"(blocks)
            : [st] "r"(step)
            : "cc", "memory");
    }
    for (; i + 8 <= len; i += 8)
        *(volatile u64 *)(p + i) = ((u64)(p + i)) * FILL_ADDR_MUL;
}

static void report_op(const char *verb, const char *region, u64 off, u64 len) {
    puts_raw(verb); puts_raw(" "); puts_raw(region); puts_raw(" ");
    put_size(off); puts_raw(" "); put_size(len);
}

/* Idles on the host: each write to the sleep port parks this vCPU's thread for up to
 * SLEEP_SLICE_MS, so the VMM still sees a stop request (timeout, exit) between slices. */
static void sleep_ms(u64 ms) {
    while (ms) {
        u64 slice = ms < SLEEP_SLICE_MS ? ms : SLEEP_SLICE_MS;
        outb(PORT_SLEEP, (u8)slice);
        ms -= slice;
    }
}

static void crash(u64 kind, u64 unbacked) {
    if (kind == CRASH_TRIPLE_FAULT) {
        struct { unsigned short limit; u64 base; } __attribute__((packed)) d = { 0, 0 };
        __asm__ volatile("lidt %0; ud2" :: "m"(d));
    } else if (kind == CRASH_MMIO_EXEC) {
        void (*f)(void) = (void (*)(void))unbacked;
        f();
    } else if (kind == CRASH_INT3) {
        __asm__ volatile("int3");
    }
}

void probe_main(u64 cpu, struct probe_block *blk) {
    struct probe_mailbox *mb = (struct probe_mailbox *)PROBE_MAILBOX_ADDR;
    load_idt();
    if (blk->magic != PROBE_MAGIC || blk->version != PROBE_VERSION) {
        if (cpu == 0) { puts_raw("probe: bad command block\n"); outb(PORT_DEBUG_EXIT, 125); }
        return;
    }
    u32 ncpus = blk->ncpus ? blk->ncpus : 1;
    if (cpu != 0) { ap_loop(mb, (u32)cpu, ncpus); return; }

    tsc_khz = blk->tsc_khz;
    outb(PORT_TRACE_MARK, MARK_PROBE_START);
    while (mb->online != ncpus - 1) cpu_relax();
    lock();
    puts_raw("probe: "); put_dec(ncpus); puts_raw(" cpu(s) online\n");
    unlock();

    for (u32 i = 0; i < blk->ncmds; i++) {
        struct probe_cmd *c = &blk->cmds[i];
        struct probe_region *r = &blk->regions[c->region < blk->nregions ? c->region : 0];
        volatile u8 *p = (volatile u8 *)(r->gpa + c->a);
        u64 t0 = rdtsc();
        switch (c->op) {
        case OP_TOUCH:
        case OP_READ:
            run_parallel(mb, c->op == OP_TOUCH ? MB_OP_TOUCH : MB_OP_READ, r->gpa + c->a, c->b, ncpus);
            report_op(c->op == OP_TOUCH ? "touch" : "read", r->name, c->a, c->b);
            puts_raw(": "); put_dec(c->b >> 12); puts_raw(" pages in "); put_dec(us_since(t0)); puts_raw(" us\n");
            break;
        case OP_WRITE:
            fill(p, c->b, (u8)c->c);
            report_op("write", r->name, c->a, c->b);
            puts_raw(" 0x"); put_hex(c->c, 2); puts_raw(": "); put_dec(us_since(t0)); puts_raw(" us\n");
            break;
        case OP_FILL_ID: {
            /* Clones share memory and script; the instance port tells them apart. */
            u8 byte = (u8)(inl(PORT_INSTANCE) + 1);
            fill(p, c->b, byte);
            report_op("fill-id", r->name, c->a, c->b);
            puts_raw(" 0x"); put_hex(byte, 2); puts_raw(": "); put_dec(us_since(t0)); puts_raw(" us\n");
            break;
        }
        case OP_FILL_ADDR:
            fill_addr(p, c->b);
            report_op("fill-addr", r->name, c->a, c->b);
            puts_raw(": "); put_dec(us_since(t0)); puts_raw(" us\n");
            break;
        case OP_SUM: {
            u64 h = checksum(p, c->b);
            report_op("sum", r->name, c->a, c->b);
            puts_raw(" = "); put_hex(h, 16); puts_raw("\n");
            break;
        }
        case OP_SLEEP:
            puts_raw("sleep "); put_dec(c->a); puts_raw(" ms\n");
            sleep_ms(c->a);
            break;
        case OP_MARK:
            outb(PORT_TRACE_MARK, (u8)c->a);
            break;
        case OP_CRASH:
            crash(c->a, blk->regions[0].gpa + blk->regions[0].size);
            break;
        case OP_RESET:
            outb(PORT_TRACE_MARK, MARK_PROBE_DONE);
            outb(0x64, 0xfe);
            return;
        case OP_EXIT:
            outb(PORT_TRACE_MARK, MARK_PROBE_DONE);
            mb->op = MB_OP_QUIT; atomic_inc(&mb->gen);
            outb(PORT_DEBUG_EXIT, (u8)c->a);
            return;
        default:
            puts_raw("probe: unknown op\n");
            outb(PORT_DEBUG_EXIT, 126);
            return;
        }
    }
    outb(PORT_TRACE_MARK, MARK_PROBE_DONE);
    mb->op = MB_OP_QUIT; atomic_inc(&mb->gen);
}
