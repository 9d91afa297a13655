//! Crash injection: every operation's storage writes and flushes are recorded; for every
//! prefix of the log (and a torn version of the next write) the files are rebuilt, reopened
//! (or repaired), and compared with the model: acknowledged data is never lost, in-flight
//! bytes are either old or new, snapshots and base data never read as zeros.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::harness::*;
use common::*;
use pcow::{AllocInit, Chain, MemStorage, Op, Recorder, Storage};

const SIZE: u64 = 12 * CS;

#[test]
fn every_crash_point_of_every_operation_recovers() {
    // Base with data everywhere, so that lost copy-on-write would read as base bytes or zeros.
    let base_mem = MemStorage::new("base");
    create_in(Arc::new(base_mem.clone()), CS, SIZE, None);
    let base_view = pattern(99, SIZE as usize);
    {
        let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
        let mut b = open_chain(&[bs]).unwrap();
        b.write(0, &base_view).unwrap();
        b.flush().unwrap();
    }
    let top_mem = MemStorage::new("top");
    {
        let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
        create_in(Arc::new(top_mem.clone()), CS, SIZE, Some(&bs));
    }
    let rec = Recorder::new();
    let top_rec = rec.wrap(0, top_mem);
    let base_rec = rec.wrap(1, base_mem);
    let storages: Vec<Arc<dyn Storage>> =
        vec![Arc::new(top_rec.clone()), Arc::new(base_rec.clone())];
    let mut chain = open_chain(&storages).unwrap();

    let mut state = State {
        view: base_view,
        snapshots: BTreeMap::new(),
    };
    let mut steps: Vec<Step> = Vec::new();
    let mut run = |name: &'static str,
                   chain: &mut Chain,
                   state: &mut State,
                   f: &mut dyn FnMut(&mut Chain, &mut State)| {
        let before = state.clone();
        let start = rec.op_count();
        f(chain, state);
        chain.flush().unwrap();
        steps.push(Step {
            name,
            start,
            end: rec.op_count(),
            before,
            after: state.clone(),
        });
    };
    let w = |off: u64, len: u64, seed: u8| {
        let len = len as usize;
        move |c: &mut Chain, s: &mut State| {
            let d = pattern(seed, len);
            c.write(off, &d).unwrap();
            s.view[off as usize..off as usize + len].copy_from_slice(&d);
        }
    };
    run(
        "partial write over base",
        &mut chain,
        &mut state,
        &mut w(CS + 1000, 9000, 1),
    );
    run(
        "write spanning clusters",
        &mut chain,
        &mut state,
        &mut w(5 * CS - 300, CS + 600, 2),
    );
    run("snapshot create s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s1").unwrap();
        s.snapshots.insert("s1".into(), s.view.clone());
    });
    run(
        "copy-on-write after snapshot",
        &mut chain,
        &mut state,
        &mut w(CS + 5000, 100, 3),
    );
    run(
        "discard cluster held below",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.discard(2 * CS, CS).unwrap();
            s.view[(2 * CS) as usize..(3 * CS) as usize].fill(0);
        },
    );
    run(
        "mapping-service copy-on-write",
        &mut chain,
        &mut state,
        &mut |c, s| {
            let a = c.allocate(7, AllocInit::Empty).unwrap();
            let unit = pattern(4, 4096);
            c.images()[0]
                .storage()
                .write_at(&unit, a.file_offset + 4096)
                .unwrap();
            c.images()[0].storage().flush().unwrap();
            c.mark_valid(7, &[0b10]).unwrap();
            s.view[(7 * CS + 4096) as usize..(7 * CS + 8192) as usize].copy_from_slice(&unit);
        },
    );
    run("discard cluster 8", &mut chain, &mut state, &mut |c, s| {
        c.discard(8 * CS, CS).unwrap();
        s.view[(8 * CS) as usize..(9 * CS) as usize].fill(0);
    });
    run(
        "mapping-service expansion",
        &mut chain,
        &mut state,
        &mut |c, s| {
            let a = c.allocate(8, AllocInit::Zeroed).unwrap();
            let d = pattern(5, 100);
            c.images()[0]
                .storage()
                .write_at(&d, a.file_offset + 10)
                .unwrap();
            s.view[(8 * CS + 10) as usize..(8 * CS + 110) as usize].copy_from_slice(&d);
        },
    );
    run("snapshot create s2", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s2").unwrap();
        s.snapshots.insert("s2".into(), s.view.clone());
    });
    run(
        "write after s2",
        &mut chain,
        &mut state,
        &mut w(0, 3 * CS, 6),
    );
    run("snapshot apply s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_apply("s1").unwrap();
        s.view = s.snapshots["s1"].clone();
    });
    run(
        "write after apply",
        &mut chain,
        &mut state,
        &mut w(6 * CS + 7, 20000, 7),
    );
    run("snapshot delete s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_delete("s1").unwrap();
        s.snapshots.remove("s1");
    });
    run("snapshot delete s2", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_delete("s2").unwrap();
        s.snapshots.remove("s2");
    });
    run("compact", &mut chain, &mut state, &mut |c, _| {
        c.compact(|_, _| {}).unwrap();
    });
    run("snapshot create s3", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s3").unwrap();
        s.snapshots.insert("s3".into(), s.view.clone());
    });
    run(
        "write after s3",
        &mut chain,
        &mut state,
        &mut w(9 * CS, 2 * CS, 8),
    );
    run(
        "snapshot delete s3 (merge into writable)",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.snapshot_delete("s3").unwrap();
            s.snapshots.remove("s3");
        },
    );
    run("commit into base", &mut chain, &mut state, &mut |c, _| {
        c.commit(|_, _| {}).unwrap();
    });
    run(
        "write after commit",
        &mut chain,
        &mut state,
        &mut w(4 * CS, 4096, 9),
    );
    run(
        "rebase onto nothing",
        &mut chain,
        &mut state,
        &mut |c, _| {
            c.rebase(None, false, |_, _| {}).unwrap();
        },
    );
    drop(chain);

    let ops = rec.ops();
    if let Ok(k) = std::env::var("PCOW_DEBUG_K") {
        let k: usize = k.parse().unwrap();
        for (i, (id, op)) in ops
            .iter()
            .enumerate()
            .take(k + 3)
            .skip(k.saturating_sub(12))
        {
            let d = match op {
                Op::Write { offset, data } => format!("write {offset} len {}", data.len()),
                o => format!("{o:?}"),
            };
            eprintln!("op {i}: file {id} {d}");
        }
    }
    let checked = check_steps(&steps, &ops, &top_rec, &base_rec);
    assert!(checked > 200, "only {checked} crash points were checked");
}
