//! Crash injection for commit and rebase of a top file with visible snapshots, and for the
//! merge of a deleted snapshot into its only child snapshot: every crash point recovers with
//! each byte old or new and every snapshot intact (harness in `common/harness.rs`).

mod common;

use common::harness::*;
use common::*;
use pcow::Chain;

const SIZE: u64 = 12 * CS;

#[test]
fn every_crash_point_of_commit_rebase_and_merge_with_snapshots_recovers() {
    // Base data everywhere but cluster 11, so snapshots read much of it through the base.
    let mut base_view = pattern(99, SIZE as usize);
    base_view[(11 * CS) as usize..].fill(0);
    let mut fx = Fixture::new(SIZE, base_view);
    let snap = |name: &'static str| {
        move |c: &mut Chain, s: &mut State| {
            c.snapshot_create(name).unwrap();
            s.snapshots.insert(name.into(), s.view.clone());
        }
    };
    fx.run("write 1", &mut write_op(CS + 1000, 9000, 1));
    fx.run("write 2", &mut write_op(5 * CS - 300, CS + 600, 2));
    fx.run("snapshot s1", &mut snap("s1"));
    fx.run("write 3", &mut write_op(6 * CS, 2 * CS, 3));
    fx.run("write 4", &mut write_op(2 * CS + 4096, 100, 4));
    fx.run("snapshot s2", &mut snap("s2"));
    fx.run("write 5", &mut write_op(9 * CS + 8192, 5000, 5));
    fx.run("discard 3", &mut |c, s| {
        c.discard(3 * CS, CS).unwrap();
        s.view[(3 * CS) as usize..(4 * CS) as usize].fill(0);
    });
    fx.run("commit with snapshots s1, s2", &mut |c, _| {
        c.commit(|_, _| {}).unwrap()
    });
    fx.run("write 6", &mut write_op(0, CS + 10, 6));
    fx.run("snapshot s3", &mut snap("s3"));
    fx.run("write 7", &mut write_op(4 * CS, 4096, 7));
    fx.run(
        "rebase onto nothing with snapshots s1, s2, s3",
        &mut |c, _| c.rebase(None, false, |_, _| {}).unwrap(),
    );
    fx.run("write 8", &mut write_op(10 * CS, 3 * CS / 2, 8));
    fx.run("delete s1 (merged into its child s2)", &mut |c, s| {
        c.snapshot_delete("s1").unwrap();
        s.snapshots.remove("s1");
    });
    fx.run("delete s2 (merged into its child s3)", &mut |c, s| {
        c.snapshot_delete("s2").unwrap();
        s.snapshots.remove("s2");
    });
    // Both deleted snapshots were merged away: only s3's record is left, and nothing leaks.
    let records = fx.chain.images()[0].snapshots();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].record.name, "s3");
    let report = fx.chain.check();
    assert!(
        report.leaks.is_empty() && report.corruptions.is_empty(),
        "{report:?}"
    );
    let checked = fx.check();
    assert!(checked > 100, "only {checked} crash points were checked");
}
