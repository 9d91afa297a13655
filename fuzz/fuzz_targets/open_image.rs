//! Fuzzes the metadata parser: any byte string opened as a pcow image must give an error
//! or a working image — never a panic or a hang — through open, check, reads and repair.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use pcow::{Chain, Image, MemStorage, Storage};

fuzz_target!(|data: &[u8]| {
    let st: Arc<dyn Storage> = Arc::new(MemStorage::from_bytes("fuzz", data));
    if let Ok(img) = Image::open(st.clone(), false) {
        let _ = pcow::check::check_image(&img);
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
});
