//! The `open_image` fuzz target's entry point (`fuzz/fuzz_targets/open_image.rs`), also
//! replayed over its corpus (`fuzz/corpus/open_image`) and mutations of it by
//! `tests/fuzz_corpus.rs`: any byte string opened as a pcow image must give an error or a
//! working image — never a panic or a hang — through open, check, reads and repair.

use std::sync::Arc;

use crate::{Chain, Image, MemStorage, Storage};

/// Opens `data` as an image read-only (check, reads of the first clusters, the snapshot
/// list), then writable (repair, a small write).
pub fn open_image(data: &[u8]) {
    let st: Arc<dyn Storage> = Arc::new(MemStorage::from_bytes("fuzz", data));
    if let Ok(img) = Image::open(st.clone(), false) {
        let _ = crate::check::check_image(&img);
        if let Ok(c) = Chain::from_images(vec![img], true) {
            let _ = c.check();
            let mut buf = vec![0u8; 4096];
            for l in 0..c.virtual_clusters().min(16) {
                let n = c.cluster_size().min(4096) as usize;
                let _ = c.read(l * c.cluster_size(), &mut buf[..n]);
            }
            let _ = c.snapshot_list();
        }
    }
    if let Ok(img) = Image::open(st, true) {
        if let Ok(mut c) = Chain::from_images(vec![img], true) {
            if c.repair().is_ok() {
                let _ = c.write(0, &[1, 2, 3]);
            }
        }
    }
}
