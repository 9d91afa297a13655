//! Crash injection for commit and rebase of a top file with visible snapshots, and for the
//! merge of a deleted snapshot into its only child snapshot: every crash point recovers with
//! each byte old or new and every snapshot intact (harness in `common/harness.rs`).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::harness::*;
use common::*;
use pcow::{Chain, MemStorage, Recorder, Storage};

const SIZE: u64 = 12 * CS;

#[test]
fn every_crash_point_of_commit_rebase_and_merge_with_snapshots_recovers() {
    let base_mem = MemStorage::new("base");
    create_in(Arc::new(base_mem.clone()), CS, SIZE, None);
    // Base data everywhere but cluster 11, so snapshots read much of it through the base.
    let mut base_view = pattern(99, SIZE as usize);
    base_view[(11 * CS) as usize..].fill(0);
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
    let snap = |name: &'static str| {
        move |c: &mut Chain, s: &mut State| {
            c.snapshot_create(name).unwrap();
            s.snapshots.insert(name.into(), s.view.clone());
        }
    };
    run(
        "write 1",
        &mut chain,
        &mut state,
        &mut w(CS + 1000, 9000, 1),
    );
    run(
        "write 2",
        &mut chain,
        &mut state,
        &mut w(5 * CS - 300, CS + 600, 2),
    );
    run("snapshot s1", &mut chain, &mut state, &mut snap("s1"));
    run("write 3", &mut chain, &mut state, &mut w(6 * CS, 2 * CS, 3));
    run(
        "write 4",
        &mut chain,
        &mut state,
        &mut w(2 * CS + 4096, 100, 4),
    );
    run("snapshot s2", &mut chain, &mut state, &mut snap("s2"));
    run(
        "write 5",
        &mut chain,
        &mut state,
        &mut w(9 * CS + 8192, 5000, 5),
    );
    run("discard 3", &mut chain, &mut state, &mut |c, s| {
        c.discard(3 * CS, CS).unwrap();
        s.view[(3 * CS) as usize..(4 * CS) as usize].fill(0);
    });
    run(
        "commit with snapshots s1, s2",
        &mut chain,
        &mut state,
        &mut |c, _| c.commit(|_, _| {}).unwrap(),
    );
    run("write 6", &mut chain, &mut state, &mut w(0, CS + 10, 6));
    run("snapshot s3", &mut chain, &mut state, &mut snap("s3"));
    run("write 7", &mut chain, &mut state, &mut w(4 * CS, 4096, 7));
    run(
        "rebase onto nothing with snapshots s1, s2, s3",
        &mut chain,
        &mut state,
        &mut |c, _| c.rebase(None, false, |_, _| {}).unwrap(),
    );
    run(
        "write 8",
        &mut chain,
        &mut state,
        &mut w(10 * CS, 3 * CS / 2, 8),
    );
    run(
        "delete s1 (merged into its child s2)",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.snapshot_delete("s1").unwrap();
            s.snapshots.remove("s1");
        },
    );
    run(
        "delete s2 (merged into its child s3)",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.snapshot_delete("s2").unwrap();
            s.snapshots.remove("s2");
        },
    );
    // Both deleted snapshots were merged away: only s3's record is left, and nothing leaks.
    let records = chain.images()[0].snapshots();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].record.name, "s3");
    let report = chain.check();
    assert!(
        report.leaks.is_empty() && report.corruptions.is_empty(),
        "{report:?}"
    );
    drop(chain);
    let checked = check_steps(&steps, &rec.ops(), &top_rec, &base_rec);
    assert!(checked > 100, "only {checked} crash points were checked");
}
