//! Model-based property test: random operation sequences against an in-memory model;
//! the image must equal the model after every operation and every reopen.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use pcow::{AllocInit, Chain, Storage};
use proptest::prelude::*;

const CS: u64 = 16384;
const SIZE: u64 = 16 * CS;

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: u64,
        len: u64,
        seed: u8,
    },
    Discard {
        off: u64,
        len: u64,
    },
    SnapCreate(u8),
    SnapApply(u8),
    SnapDelete(u8),
    Commit,
    /// Rebase onto no backing file (flatten).
    RebaseNone,
    Compact,
    Reopen,
    /// Mapping-service copy-on-write of one 4 KiB unit.
    MapCow {
        cluster: u64,
        unit: u64,
        seed: u8,
    },
    /// Mapping-service expansion of an unallocated cluster.
    MapExpand {
        cluster: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SIZE, 1..3 * CS, any::<u8>()).prop_map(|(off, len, seed)| Op::Write {
            off,
            len: len.min(SIZE - off),
            seed
        }),
        2 => (0..SIZE, 1..3 * CS).prop_map(|(off, len)| Op::Discard { off, len: len.min(SIZE - off) }),
        2 => (0u8..4).prop_map(Op::SnapCreate),
        1 => (0u8..4).prop_map(Op::SnapApply),
        1 => (0u8..4).prop_map(Op::SnapDelete),
        1 => Just(Op::Commit),
        1 => Just(Op::RebaseNone),
        1 => Just(Op::Compact),
        2 => Just(Op::Reopen),
        2 => (0..SIZE / CS, 0..CS / 4096, any::<u8>()).prop_map(|(cluster, unit, seed)| Op::MapCow { cluster, unit, seed }),
        1 => (0..SIZE / CS).prop_map(|cluster| Op::MapExpand { cluster }),
    ]
}

struct Model {
    current: Vec<u8>,
    base: Vec<u8>,
    snapshots: BTreeMap<String, Vec<u8>>,
    /// False after a rebase onto nothing.
    has_base: bool,
}

/// The chain's files: top and base, or the top alone after a rebase onto nothing.
fn files(storages: &[Arc<dyn Storage>], has_base: bool) -> &[Arc<dyn Storage>] {
    if has_base {
        storages
    } else {
        &storages[..1]
    }
}

fn run(ops: Vec<Op>) {
    let base = mem("base");
    create_in(base.clone(), CS, SIZE, None);
    let mut model = Model {
        current: vec![0; SIZE as usize],
        base: vec![0; SIZE as usize],
        snapshots: BTreeMap::new(),
        has_base: true,
    };
    {
        // Give the base some content so copy-on-write and discard tombstones matter.
        let mut b = open_chain(std::slice::from_ref(&base)).unwrap();
        let data = pattern(7, (SIZE / 2) as usize);
        b.write(CS / 2, &data).unwrap();
        b.flush().unwrap();
        model.current[(CS / 2) as usize..(CS / 2 + SIZE / 2) as usize].copy_from_slice(&data);
        model.base = model.current.clone();
    }
    let top = mem("top");
    create_in(top.clone(), CS, SIZE, Some(&base));
    let storages: Vec<Arc<dyn Storage>> = vec![top, base];
    let mut chain: Chain = open_chain(&storages).unwrap();
    for op in ops {
        let op_name = format!("{op:?}");
        match op {
            Op::Write { off, len, seed } => {
                let data = pattern(seed, len as usize);
                chain.write(off, &data).unwrap();
                model.current[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            Op::Discard { off, len } => {
                chain.discard(off, len).unwrap();
                model.current[off as usize..(off + len) as usize].fill(0);
            }
            Op::SnapCreate(n) => {
                let name = format!("s{n}");
                let r = chain.snapshot_create(&name);
                if model.snapshots.contains_key(&name) {
                    assert!(r.is_err());
                } else {
                    r.unwrap();
                    model.snapshots.insert(name, model.current.clone());
                }
            }
            Op::SnapApply(n) => {
                let name = format!("s{n}");
                let r = chain.snapshot_apply(&name);
                match model.snapshots.get(&name) {
                    Some(s) => {
                        r.unwrap();
                        model.current = s.clone();
                    }
                    None => assert!(r.is_err()),
                }
            }
            Op::SnapDelete(n) => {
                let name = format!("s{n}");
                let r = chain.snapshot_delete(&name);
                match model.snapshots.remove(&name) {
                    Some(_) => r.unwrap(),
                    None => assert!(r.is_err()),
                }
            }
            Op::Commit => {
                // Visible snapshots are kept (their views must not change).
                let r = chain.commit(|_, _| {});
                if model.has_base {
                    r.unwrap();
                    model.base = model.current.clone();
                    let b = open_chain(&storages[1..]).unwrap();
                    assert_same(&read_all(&b), &model.base, "base after commit");
                } else {
                    assert!(r.is_err());
                }
            }
            Op::RebaseNone => {
                chain.rebase(None, false, |_, _| {}).unwrap();
                model.has_base = false;
            }
            Op::MapCow {
                cluster,
                unit,
                seed,
            } => {
                let a = chain.allocate(cluster, AllocInit::Empty).unwrap();
                let data = pattern(seed, 4096);
                let top = chain.images()[0].storage().clone();
                top.write_at(&data, a.file_offset + unit * 4096).unwrap();
                top.flush().unwrap();
                chain.mark_valid(cluster, &[1u64 << unit]).unwrap();
                let at = (cluster * CS + unit * 4096) as usize;
                model.current[at..at + 4096].copy_from_slice(&data);
            }
            Op::MapExpand { cluster } => {
                if chain.lookup(cluster).is_none() {
                    let a = chain.allocate(cluster, AllocInit::Zeroed).unwrap();
                    assert!(a.newly_allocated);
                    assert!(
                        !chain
                            .allocate(cluster, AllocInit::Zeroed)
                            .unwrap()
                            .newly_allocated
                    );
                }
            }
            Op::Compact => {
                chain.compact(|_, _| {}).unwrap();
            }
            Op::Reopen => {
                drop(chain);
                chain = open_chain(files(&storages, model.has_base)).unwrap();
                let report = chain.check();
                assert!(report.corruptions.is_empty(), "{:?}", report.corruptions);
                assert!(report.leaks.is_empty(), "{:?}", report.leaks);
            }
        }
        chain.flush().unwrap();
        assert_same(
            &read_all(&chain),
            &model.current,
            &format!("after {op_name}"),
        );
        let names: Vec<String> = chain
            .snapshot_list()
            .into_iter()
            .map(|s| s.record.name)
            .collect();
        let want: Vec<String> = model.snapshots.keys().cloned().collect();
        let mut names_sorted = names.clone();
        names_sorted.sort();
        assert_eq!(names_sorted, want);
    }
    // Every snapshot still reads as it was taken (apply each, compare, after a reopen).
    drop(chain);
    let mut chain = open_chain(files(&storages, model.has_base)).unwrap();
    for (name, content) in &model.snapshots {
        chain.snapshot_apply(name).unwrap();
        assert_same(&read_all(&chain), content, &format!("snapshot {name}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]
    #[test]
    fn image_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops);
    }
}
