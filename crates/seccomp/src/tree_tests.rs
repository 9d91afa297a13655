//! The search program against seccompiler's linear chain, run by a small classic-BPF
//! interpreter: for every kind, both policies, every system call number and many argument
//! vectors, both must give the same answer.

use super::*;
use crate::filters::{self, Policy};
use crate::ThreadKind;
use seccompiler::{SeccompFilter, TargetArch};

/// The other opcodes seccompiler's conditions use: `BPF_ALU | BPF_AND | BPF_K`,
/// `BPF_JMP | BPF_JGT | BPF_K`, `BPF_JMP | BPF_JSET | BPF_K`.
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JMP_JGT_K: u16 = 0x25;
const BPF_JMP_JSET_K: u16 = 0x45;

/// `struct seccomp_data` as the program sees it.
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    fn word(&self, off: u32) -> u32 {
        match off {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction_pointer
            16..=63 if off % 4 == 0 => {
                let arg = self.args[((off - 16) / 8) as usize];
                if off % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load from offset {off}"),
        }
    }
}

/// Runs `prog` on `d`: (the returned action, instructions executed before the first
/// argument load or the return: what the kernel's action cache pass walks).
fn run(prog: &[sock_filter], d: &Data) -> (u32, usize) {
    let (mut pc, mut a, mut steps, mut const_steps) = (0usize, 0u32, 0usize, None);
    loop {
        let i = prog
            .get(pc)
            .unwrap_or_else(|| panic!("ran off the end at {pc}"));
        steps += 1;
        assert!(steps <= prog.len(), "a loop");
        pc += 1;
        match i.code {
            BPF_LD_W_ABS => {
                if i.k >= 16 && const_steps.is_none() {
                    const_steps = Some(steps - 1);
                }
                a = d.word(i.k);
            }
            BPF_ALU_AND_K => a &= i.k,
            BPF_JMP_JA => pc += i.k as usize,
            BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JGT_K | BPF_JMP_JSET_K => {
                let hit = match i.code {
                    BPF_JMP_JEQ_K => a == i.k,
                    BPF_JMP_JGE_K => a >= i.k,
                    BPF_JMP_JGT_K => a > i.k,
                    _ => a & i.k != 0,
                };
                pc += usize::from(if hit { i.jt } else { i.jf });
            }
            BPF_RET_K => return (i.k, const_steps.unwrap_or(steps)),
            code => panic!("instruction {code:#x} at {}", pc - 1),
        }
    }
}

/// The kernel's checks of a classic program (`bpf_check_classic`, `seccomp_check_filter`)
/// that a program built here could fail: every jump lands inside the program, the last
/// instruction returns, the length is within the limit.
fn check_classic(prog: &[sock_filter]) {
    let len = prog.len();
    assert!(len > 0 && len <= MAX_LEN, "length {len}");
    for (pc, i) in prog.iter().enumerate() {
        match i.code {
            BPF_JMP_JA => assert!((i.k as usize) < len - pc - 1, "JA at {pc} out"),
            BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JGT_K | BPF_JMP_JSET_K => assert!(
                pc + usize::from(i.jt.max(i.jf)) + 1 < len,
                "jump at {pc} out ({}/{} of {len})",
                i.jt,
                i.jf
            ),
            BPF_LD_W_ABS => assert!(i.k < 64 && i.k % 4 == 0, "load at {pc}"),
            BPF_RET_K | BPF_ALU_AND_K => {}
            code => panic!("instruction {code:#x} at {pc}"),
        }
    }
    assert_eq!(prog[len - 1].code, BPF_RET_K, "the last instruction");
}

/// The kernel's choice among stacked filters' answers: the most restrictive action.
fn stacked(answers: &[u32]) -> u32 {
    let rank = |r: u32| (r & 0xffff_0000) as i32;
    *answers.iter().min_by_key(|&&r| rank(r)).unwrap()
}

/// What densevm installed before the search: seccompiler's linear allow-list, then a
/// second filter answering `clone3` with ENOSYS.
fn linear(kind: ThreadKind, policy: &Policy) -> [BpfProgram; 2] {
    let mismatch = if policy.log_only {
        SeccompAction::Log
    } else {
        SeccompAction::Trap
    };
    let arch = TargetArch::x86_64;
    let main = SeccompFilter::new(
        filters::rules(kind).unwrap(),
        mismatch,
        SeccompAction::Allow,
        arch,
    )
    .unwrap();
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .unwrap();
    [main.try_into().unwrap(), clone3.try_into().unwrap()]
}

/// xorshift64*: arguments without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A 32-bit half: one of the program's constants (or 0 / all ones), sometimes with random
/// bits added, sometimes random.
fn half(rng: &mut Rng, constants: &[u32]) -> u32 {
    let r = rng.next();
    let base = match r % 4 {
        0 => r as u32 >> 8,
        1 => [0, u32::MAX][(r >> 8) as usize % 2],
        _ => constants[(r >> 8) as usize % constants.len()],
    };
    if r & 0x30 == 0 {
        base | (rng.next() as u32 & rng.next() as u32)
    } else {
        base
    }
}

#[test]
fn the_search_answers_as_the_linear_chain_did() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut compared = 0u64;
    for &kind in ThreadKind::ALL {
        for log_only in [false, true] {
            let policy = Policy { log_only };
            let old = linear(kind, &policy);
            let new = filters::compile(kind, &policy).unwrap();
            check_classic(&new);
            let constants: Vec<u32> = old[0].iter().map(|i| i.k).collect();
            let nrs = (0..480u32).chain([
                0x4000_0000,
                0x4000_0001,
                0x4000_0000 + 9,
                u32::MAX - 1,
                u32::MAX,
            ]);
            for nr in nrs {
                for (arch, vectors) in [(AUDIT_ARCH_X86_64, 64), (0x4000_0003, 2), (0, 1)] {
                    for _ in 0..vectors {
                        let mut args = [0u64; 6];
                        for a in &mut args {
                            let (hi, lo) = (half(&mut rng, &constants), half(&mut rng, &constants));
                            *a = u64::from(hi) << 32 | u64::from(lo);
                        }
                        let d = Data { nr, arch, args };
                        let want = stacked(&[run(&old[0], &d).0, run(&old[1], &d).0]);
                        let got = run(&new, &d).0;
                        assert_eq!(
                            got, want,
                            "{kind:?} log_only={log_only} nr={nr} arch={arch:#x} args={args:x?}"
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    assert!(compared > 1_000_000, "{compared}");
}

/// The point of the search: the kernel's action-cache pass runs a filter once per system
/// call number, until an argument load or a return; the linear chain took hundreds of
/// instructions a number, the search takes a few.
#[test]
fn every_number_is_settled_in_few_instructions() {
    for &kind in ThreadKind::ALL {
        let policy = Policy::default();
        let new = filters::compile(kind, &policy).unwrap();
        let old = linear(kind, &policy);
        let (mut new_total, mut old_total, mut new_worst) = (0, 0, 0);
        for nr in 0..470 {
            let d = Data {
                nr,
                arch: AUDIT_ARCH_X86_64,
                args: [0; 6],
            };
            let n = run(&new, &d).1;
            new_worst = new_worst.max(n);
            new_total += n;
            old_total += run(&old[0], &d).1;
        }
        assert!(new_worst <= 24, "{kind:?}: {new_worst} instructions");
        assert!(
            new_total * 5 < old_total,
            "{kind:?}: {new_total} against {old_total} instructions"
        );
    }
}

#[test]
fn empty_and_bad_lists() {
    let prog = compile(BTreeMap::new(), SeccompAction::Trap, SeccompAction::Allow).unwrap();
    let d = Data {
        nr: 0,
        arch: AUDIT_ARCH_X86_64,
        args: [0; 6],
    };
    assert_eq!(run(&prog, &d).0, libc::SECCOMP_RET_TRAP);
    let bad = BTreeMap::from([(-1, Entry::Rules(Vec::new()))]);
    assert!(matches!(
        compile(bad, SeccompAction::Trap, SeccompAction::Allow),
        Err(Error::BadNumber(-1))
    ));
    // Every number from 0 to 4,999 allowed: past the kernel's length limit.
    let many = (0..5000).map(|nr| (nr, Entry::Rules(Vec::new()))).collect();
    assert!(matches!(
        compile(many, SeccompAction::Trap, SeccompAction::Allow),
        Err(Error::TooLong(_))
    ));
}
