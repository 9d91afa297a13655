//! The crash-injection harness: per recorded step, every prefix of the storage log (and a
//! torn version of the next write) is rebuilt, reopened (or repaired) and compared with the
//! states before and after the step.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use pcow::{Chain, Image, MemStorage, Op, Recorder, RecordingStorage, Storage};

/// Chunk size used by the crash tests.
pub const CS: u64 = 16384;

#[derive(Clone)]
pub struct State {
    pub view: Vec<u8>,
    pub snapshots: BTreeMap<String, Vec<u8>>,
}

pub struct Step {
    pub name: &'static str,
    pub start: usize,
    pub end: usize,
    pub before: State,
    pub after: State,
}

pub fn open_or_repair(storages: &[Arc<dyn Storage>]) -> Chain {
    match open_chain(storages) {
        Ok(c) => c,
        Err(first) => {
            let images: Vec<Image> = storages
                .iter()
                .map(|s| Image::open(s.clone(), true))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("open failed ({first}) and files unreadable: {e}"));
            let mut c = Chain::from_images(images, true)
                .unwrap_or_else(|e| panic!("open failed ({first}); tolerant open failed: {e}"));
            c.repair()
                .unwrap_or_else(|e| panic!("open failed ({first}); repair failed: {e}"));
            drop(c);
            open_chain(storages).unwrap_or_else(|e| panic!("reopen after repair failed: {e}"))
        }
    }
}

pub fn verify(storages: &[Arc<dyn Storage>], before: &State, after: &State, what: &str) {
    let mut chain = open_or_repair(storages);
    let got = read_all(&chain);
    for (i, (&g, (&b, &a))) in got
        .iter()
        .zip(before.view.iter().zip(&after.view))
        .enumerate()
    {
        assert!(
            g == b || g == a,
            "{what}: byte {i} (cluster {}, unit {}) is {g}, expected old {b} or new {a}",
            i as u64 / CS,
            (i as u64 % CS) / 4096
        );
    }
    let names: Vec<String> = chain
        .snapshot_list()
        .into_iter()
        .map(|s| s.record.name)
        .collect();
    for n in &names {
        assert!(
            before.snapshots.contains_key(n) || after.snapshots.contains_key(n),
            "{what}: unexpected snapshot {n}"
        );
    }
    for n in before.snapshots.keys() {
        if after.snapshots.contains_key(n) {
            assert!(names.contains(n), "{what}: snapshot {n} lost");
        }
    }
    // The image stays usable: a new write lands and nothing else changes.
    let probe = pattern(201, 5000);
    chain.write(3 * CS + 100, &probe).unwrap();
    chain.flush().unwrap();
    let mut want = got.clone();
    want[(3 * CS + 100) as usize..(3 * CS + 100) as usize + 5000].copy_from_slice(&probe);
    drop(chain);
    let mut chain = open_chain(storages).unwrap();
    assert_same(
        &read_all(&chain),
        &want,
        &format!("{what}: write after recovery"),
    );
    // Snapshot contents are intact.
    for n in &names {
        let content = before
            .snapshots
            .get(n)
            .or_else(|| after.snapshots.get(n))
            .unwrap();
        chain.snapshot_apply(n).unwrap();
        assert_same(&read_all(&chain), content, &format!("{what}: snapshot {n}"));
    }
}

/// Checks every crash point of every step; returns how many were checked.
pub fn check_steps(
    steps: &[Step],
    ops: &[(usize, Op)],
    top_rec: &RecordingStorage,
    base_rec: &RecordingStorage,
) -> usize {
    let mut checked = 0;
    for step in steps {
        for k in step.start..=step.end {
            let storages_k = |torn: Option<usize>| -> Vec<Arc<dyn Storage>> {
                vec![
                    Arc::new(top_rec.replay(k, torn)) as Arc<dyn Storage>,
                    Arc::new(base_rec.replay(k, torn)),
                ]
            };
            let what = format!(
                "{} crash after op {k} of {}..{}",
                step.name, step.start, step.end
            );
            let storages = storages_k(None);
            verify_flexible(&storages, step, &what);
            checked += 1;
            if let Some((_, Op::Write { data, .. })) = ops.get(k) {
                if k < step.end && data.len() > 8 {
                    let torn = storages_k(Some((data.len() / 2) & !7));
                    verify_flexible(&torn, step, &format!("{what} + torn write"));
                    checked += 1;
                }
            }
        }
    }
    checked
}

/// The rebase step removes the backing file from the header; a crash image may or may not
/// name it, so the chain is opened with as many files as the header asks for.
pub fn verify_flexible(storages: &[Arc<dyn Storage>], step: &Step, what: &str) {
    let top = Image::open(storages[0].clone(), false);
    let needs_base = top
        .map(|i| !i.header().backing_name.is_empty())
        .unwrap_or(true);
    let files = if needs_base { storages } else { &storages[..1] };
    verify(files, &step.before, &step.after, what);
}

/// A recorded top over a recorded base that holds `base_view`, opened as a chain, with the
/// steps run on it so far: what every crash test starts from.
pub struct Fixture {
    pub rec: Recorder,
    pub top_rec: RecordingStorage,
    pub base_rec: RecordingStorage,
    pub chain: Chain,
    pub state: State,
    pub steps: Vec<Step>,
}

impl Fixture {
    /// Base and top images of `size` bytes ([`CS`] clusters), the base written with
    /// `base_view` and flushed before recording starts.
    pub fn new(size: u64, base_view: Vec<u8>) -> Fixture {
        let base_mem = MemStorage::new("base");
        create_in(Arc::new(base_mem.clone()), CS, size, None);
        {
            let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
            let mut b = open_chain(&[bs]).unwrap();
            b.write(0, &base_view).unwrap();
            b.flush().unwrap();
        }
        let top_mem = MemStorage::new("top");
        {
            let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
            create_in(Arc::new(top_mem.clone()), CS, size, Some(&bs));
        }
        let rec = Recorder::new();
        let top_rec = rec.wrap(0, top_mem);
        let base_rec = rec.wrap(1, base_mem);
        let storages: Vec<Arc<dyn Storage>> =
            vec![Arc::new(top_rec.clone()), Arc::new(base_rec.clone())];
        let chain = open_chain(&storages).unwrap();
        Fixture {
            rec,
            top_rec,
            base_rec,
            chain,
            state: State {
                view: base_view,
                snapshots: BTreeMap::new(),
            },
            steps: Vec::new(),
        }
    }

    /// Runs one step on the chain and the model, flushes, and records its log range.
    pub fn run(&mut self, name: &'static str, f: &mut dyn FnMut(&mut Chain, &mut State)) {
        let before = self.state.clone();
        let start = self.rec.op_count();
        f(&mut self.chain, &mut self.state);
        self.chain.flush().unwrap();
        self.steps.push(Step {
            name,
            start,
            end: self.rec.op_count(),
            before,
            after: self.state.clone(),
        });
    }

    /// Checks every crash point of every step run ([`check_steps`]).
    pub fn check(self) -> usize {
        drop(self.chain);
        check_steps(&self.steps, &self.rec.ops(), &self.top_rec, &self.base_rec)
    }
}

/// A step writing `len` bytes of `pattern(seed)` at `off`.
pub fn write_op(off: u64, len: u64, seed: u8) -> impl FnMut(&mut Chain, &mut State) {
    let len = len as usize;
    move |c: &mut Chain, s: &mut State| {
        let d = pattern(seed, len);
        c.write(off, &d).unwrap();
        s.view[off as usize..off as usize + len].copy_from_slice(&d);
    }
}
