//! A kind's allow-list as one BPF program that finds the system call number by binary
//! search, where seccompiler's `SeccompFilter` compares it with every listed call in turn.
//!
//! Why: when a thread installs a filter, the kernel runs the program on every system call
//! number (~460 on x86_64) to learn which calls it allows whatever their arguments (the
//! filter's action cache, `seccomp_cache_prepare`), with interrupts off and the thread
//! waiting. With a linear chain each number walked through ~100–240 instructions: on the
//! development host an install cost 0.2–0.75 ms of CPU (88 % of it in that cache pass),
//! per thread, at every VM start. Through the search a number takes ~15 instructions
//! (`tree_tests.rs` checks that every number is settled within 24), and an install
//! 0.04–0.1 ms.
//!
//! The argument conditions are still seccompiler's: each rule is compiled by
//! `From<SeccompRule> for BpfProgram`, a self-contained piece that falls through to the
//! instruction after it when its conditions hold and jumps over that instruction when they
//! do not. So a call's block is `rule, RET match, rule, RET match, …, RET mismatch`, as in
//! seccompiler's own chain; only the dispatch to the block differs.

use seccompiler::{sock_filter, BpfProgram, SeccompAction, SeccompRule};
use std::collections::BTreeMap;

// Classic BPF opcodes (linux/bpf_common.h): class | size/operation | source.
/// `BPF_LD | BPF_W | BPF_ABS` (0x00 | 0x00 | 0x20): a word of `seccomp_data`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`.
const BPF_JMP_JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
/// `BPF_RET | BPF_K`.
const BPF_RET_K: u16 = 0x06;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// The kernel's limit on a program's length (`BPF_MAXINSNS`).
const MAX_LEN: usize = 4096;
/// Numbers compared one by one at the bottom of the search.
const LEAF: usize = 4;

/// What a listed call gets.
pub(crate) enum Entry {
    /// Allowed when one of the rules holds (none: always).
    Rules(Vec<SeccompRule>),
    /// Always answered with this action, whatever the arguments.
    Action(SeccompAction),
}

/// Why a program could not be built.
#[derive(Debug)]
pub(crate) enum Error {
    /// More instructions than the kernel accepts.
    TooLong(usize),
    /// A system call number that is not one (negative or past 32 bits).
    BadNumber(i64),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::TooLong(n) => write!(f, "the filter has {n} instructions (most: {MAX_LEN})"),
            Error::BadNumber(nr) => write!(f, "{nr} is not a system call number"),
        }
    }
}

/// A jump whose target is known only once every block is placed.
enum Target {
    /// The block of the call at this index of the sorted list.
    Block(usize),
    /// Another place in the search.
    Place(usize),
}

struct Builder {
    prog: BpfProgram,
    /// (instruction index of a `JA`, where it goes).
    fixups: Vec<(usize, Target)>,
    places: Vec<usize>,
    nrs: Vec<u32>,
    /// Whether `nrs[i]` is allowed whatever its arguments (it then has no block).
    plain: Vec<bool>,
    mismatch: u32,
    matched: u32,
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

impl Builder {
    fn ja(&mut self, to: Target) {
        self.fixups.push((self.prog.len(), to));
        self.prog.push(stmt(BPF_JMP_JA, 0));
    }

    /// The search over `nrs[lo..hi]`, with the number in the accumulator.
    fn search(&mut self, lo: usize, hi: usize) {
        if hi - lo <= LEAF {
            // A call allowed whatever its arguments jumps to the leaf's own `RET matched`
            // at its end; another to its block, through the `JA` after its comparison.
            let len: usize = (lo..hi).map(|i| if self.plain[i] { 1 } else { 2 }).sum();
            let any_plain = self.plain[lo..hi].iter().any(|&p| p);
            let mut left = len;
            for i in lo..hi {
                if self.plain[i] {
                    left -= 1;
                    // Past the rest of the comparisons and the `RET mismatch`. A leaf
                    // is at most 2 × LEAF instructions, so this fits a u8.
                    self.prog
                        .push(jump(BPF_JMP_JEQ_K, self.nrs[i], (left + 1) as u8, 0));
                } else {
                    left -= 2;
                    self.prog.push(jump(BPF_JMP_JEQ_K, self.nrs[i], 0, 1));
                    self.ja(Target::Block(i));
                }
            }
            self.prog.push(stmt(BPF_RET_K, self.mismatch));
            if any_plain {
                self.prog.push(stmt(BPF_RET_K, self.matched));
            }
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let upper = self.places.len();
        self.places.push(0);
        // At least nrs[mid]: the jump to the upper half; below it: the lower half, next.
        self.prog.push(jump(BPF_JMP_JGE_K, self.nrs[mid], 0, 1));
        self.ja(Target::Place(upper));
        self.search(lo, mid);
        self.places[upper] = self.prog.len();
        self.search(mid, hi);
    }
}

/// The program: the architecture check (anything but x86_64 kills the process, as
/// seccompiler's does), the search, then each call's block. Calls not listed get
/// `mismatch`, a listed call's rules `matched`.
pub(crate) fn compile(
    calls: BTreeMap<i64, Entry>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, Error> {
    let mismatch = u32::from(mismatch);
    let matched = u32::from(matched);
    let nrs = calls
        .keys()
        .map(|&nr| u32::try_from(nr).map_err(|_| Error::BadNumber(nr)))
        .collect::<Result<Vec<_>, _>>()?;
    let plain = calls
        .values()
        .map(|e| matches!(e, Entry::Rules(r) if r.is_empty()))
        .collect();
    let mut b = Builder {
        prog: vec![
            stmt(BPF_LD_W_ABS, DATA_ARCH),
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
            stmt(BPF_LD_W_ABS, DATA_NR),
        ],
        fixups: Vec::new(),
        places: Vec::new(),
        nrs,
        plain,
        mismatch,
        matched,
    };
    if !b.nrs.is_empty() {
        b.search(0, b.nrs.len());
    } else {
        b.prog.push(stmt(BPF_RET_K, mismatch));
    }
    let mut blocks = Vec::with_capacity(calls.len());
    for entry in calls.into_values() {
        blocks.push(b.prog.len());
        match entry {
            Entry::Action(action) => b.prog.push(stmt(BPF_RET_K, u32::from(action))),
            // Settled in its leaf.
            Entry::Rules(rules) if rules.is_empty() => {}
            Entry::Rules(rules) => {
                for rule in rules {
                    b.prog.extend(BpfProgram::from(rule));
                    b.prog.push(stmt(BPF_RET_K, matched));
                }
                b.prog.push(stmt(BPF_RET_K, mismatch));
            }
        }
        if b.prog.len() > MAX_LEN {
            return Err(Error::TooLong(b.prog.len()));
        }
    }
    // A rule's program starts `JA 1; JA n`: seccompiler's chain enters the second
    // instruction to skip the call (its comparison's false branch), and `n` lands one past
    // the call's final `RET mismatch`. Blocks here are entered at their first instruction,
    // so that jump never runs, but the kernel rejects a program with a jump past its end:
    // one more `RET mismatch` keeps the last block's in bounds.
    b.prog.push(stmt(BPF_RET_K, mismatch));
    for (at, to) in std::mem::take(&mut b.fixups) {
        let target = match to {
            Target::Block(i) => blocks[i],
            Target::Place(p) => b.places[p],
        };
        // Forward only: blocks follow the search, and a place follows its jump.
        b.prog[at].k = u32::try_from(target - at - 1).map_err(|_| Error::TooLong(target))?;
    }
    if b.prog.len() > MAX_LEN {
        return Err(Error::TooLong(b.prog.len()));
    }
    Ok(b.prog)
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
