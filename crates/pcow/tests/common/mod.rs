//! Helpers shared by the integration tests: in-memory chains and reopening.
#![allow(dead_code)]

pub mod harness;

use std::sync::Arc;

use pcow::{new_header, Chain, CreateOptions, Image, MemStorage, Storage};

/// Creates an image in `storage` (optionally backed by the image in `base`).
pub fn create_in(storage: Arc<dyn Storage>, cs: u64, size: u64, base: Option<&Arc<dyn Storage>>) {
    let backing_id = base.map_or([0; 16], |b| {
        Image::open(b.clone(), false).unwrap().header().image_id
    });
    let opts = CreateOptions {
        virtual_size: size,
        cluster_size: cs,
        backing: base.map(|_| "base".to_string()),
    };
    Image::create(storage, new_header(&opts, backing_id).unwrap()).unwrap();
}

/// Opens the chain made of `storages` (top first), everything writable.
pub fn open_chain(storages: &[Arc<dyn Storage>]) -> pcow::Result<Chain> {
    let mut images = Vec::new();
    for s in storages {
        images.push(Image::open(s.clone(), true)?);
    }
    Chain::from_images(images, false)
}

/// A fresh in-memory storage.
pub fn mem(name: &str) -> Arc<dyn Storage> {
    Arc::new(MemStorage::new(name))
}

/// Reads the whole virtual disk.
pub fn read_all(chain: &Chain) -> Vec<u8> {
    let mut v = vec![0u8; chain.virtual_size() as usize];
    chain.read(0, &mut v).unwrap();
    v
}

/// Deterministic pattern bytes.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i % 251) as u8) | 1)
        .collect()
}

/// Asserts equality of two byte images, reporting only the first difference.
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: first difference at byte {i} (cluster-of-16K {}, unit {}): got {} want {}",
            i / 16384,
            (i % 16384) / 4096,
            got[i],
            want[i]
        );
    }
}
