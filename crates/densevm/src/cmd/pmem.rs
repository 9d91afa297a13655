//! `--pmem` images of a VM: each mapped as a region the VMM places above RAM, with the
//! hooks the VMM calls (vCPU writes KVM cannot complete, the read-only ranges, flush).
//!
//! A region can move onto another image in place (`move_to`): a clone template freezes
//! each image as the base of the clones' overlays, and the parent goes on in an overlay of
//! its own, mapped at the same host address so the VM's memory slots stay valid. The
//! hooks look the current mapping up on every call, so they follow the move.

use anyhow::Context;
use densevm_pmem::{GuestWrite, MapOptions, PmemRegion, WriteFaultHandle};
use densevm_vmm::write_fault::Outcome;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// One mapped image and where its hooks find it.
struct Slot {
    /// The image the region maps now (its top layer).
    path: Mutex<PathBuf>,
    region: Mutex<Option<PmemRegion>>,
    handle: RwLock<WriteFaultHandle>,
}

impl Slot {
    /// The current mapping's handle, read-locked (no clone on the vCPU write-exit path).
    fn handle(&self) -> std::sync::RwLockReadGuard<'_, WriteFaultHandle> {
        self.handle.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `--pmem` images of a VM.
#[derive(Clone, Default)]
pub struct PmemRegions {
    slots: Vec<Arc<Slot>>,
}

fn open_chain(path: &Path) -> anyhow::Result<Arc<pcow::SharedChain>> {
    let opts = pcow::OpenOptions {
        writable: true,
        ..Default::default()
    };
    let chain = pcow::Chain::open(path, opts).with_context(|| {
        format!(
            "cannot open --pmem image {} (create it with `densevm image create`)",
            path.display()
        )
    })?;
    Ok(pcow::SharedChain::new(chain))
}

impl PmemRegions {
    /// Opens and maps every image.
    pub fn open(images: &[PathBuf]) -> anyhow::Result<Self> {
        let mut slots = Vec::new();
        for path in images {
            let region = PmemRegion::map(open_chain(path)?, MapOptions::default())
                .with_context(|| format!("cannot map --pmem image {}", path.display()))?;
            slots.push(Arc::new(Slot {
                path: Mutex::new(path.clone()),
                handle: RwLock::new(region.write_fault_handle()),
                region: Mutex::new(Some(region)),
            }));
        }
        Ok(PmemRegions { slots })
    }

    /// How many images.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The image region `n` maps now.
    pub fn path(&self, n: usize) -> PathBuf {
        self.slots[n]
            .path
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The regions as the VMM places them, each with its hooks.
    pub fn external_regions(&self) -> Vec<densevm_vmm::ExternalRegion> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let region = slot.region.lock().unwrap_or_else(|p| p.into_inner());
                let region = region.as_ref().expect("a mapped region");
                let (writer, ranges, flusher) = (slot.clone(), slot.clone(), slot.clone());
                let hook: densevm_vmm::write_fault::Handler =
                    Arc::new(move |offset: u64, data: Option<&[u8]>| {
                        match writer.handle().guest_write(offset, data) {
                            Ok(GuestWrite::Served) => Outcome::Served,
                            Ok(GuestWrite::AlreadyWritable) => Outcome::Stale,
                            Err(e) => {
                                tracing::error!("pmem: guest write at offset {offset:#x}: {e}");
                                Outcome::Failed
                            }
                        }
                    });
                densevm_vmm::ExternalRegion {
                    flush: Some(Arc::new(move || {
                        flusher.handle().flush().map_err(std::io::Error::other)
                    })),
                    name: format!("pmem{i}"),
                    host_addr: region.host_addr(),
                    size: region.size(),
                    kvm_readonly: region.lower_layer_ranges().to_vec(),
                    write_fault: Some(hook),
                    readonly_ranges: Some(Arc::new(move || ranges.handle().readonly_ranges())),
                }
            })
            .collect()
    }

    /// Moves region `n` onto the image `path` (an overlay whose base is the image it maps
    /// now), at the same host address. Only while the VM is paused with its devices
    /// quiesced: between the unmap and the new mapping the range holds nothing. If the new
    /// image cannot be mapped, the old one is mapped again and the error returned.
    pub fn move_to(&self, n: usize, path: &Path) -> anyhow::Result<()> {
        let slot = &self.slots[n];
        let mut guard = slot.region.lock().unwrap_or_else(|p| p.into_inner());
        let old = guard.take().context("the --pmem region is not mapped")?;
        let addr = old.host_addr();
        let old_chain = old.chain().clone();
        let opts = MapOptions {
            at: Some(addr),
            ..MapOptions::default()
        };
        if let Err(e) = old.flush() {
            *guard = Some(old);
            return Err(e).context("flushing the --pmem image before moving it");
        }
        drop(old);
        let mapped = open_chain(path).and_then(|chain| {
            PmemRegion::map(chain, opts.clone())
                .with_context(|| format!("cannot map --pmem overlay {}", path.display()))
        });
        let region = match mapped {
            Ok(region) => {
                *slot.path.lock().unwrap_or_else(|p| p.into_inner()) = path.to_path_buf();
                region
            }
            Err(e) => {
                let back = PmemRegion::map(old_chain, opts)
                    .context("the old --pmem image could not be mapped back either")?;
                *slot.handle.write().unwrap_or_else(|p| p.into_inner()) = back.write_fault_handle();
                *guard = Some(back);
                return Err(e);
            }
        };
        *slot.handle.write().unwrap_or_else(|p| p.into_inner()) = region.write_fault_handle();
        *guard = Some(region);
        Ok(())
    }

    /// Fault-service figures of each region, for `--json`.
    pub fn stats(&self) -> Vec<Value> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| {
                let region = slot.region.lock().unwrap_or_else(|p| p.into_inner());
                let s = region.as_ref()?.stats();
                Some(json!({
                    "name": format!("pmem{i}"),
                    "image": *slot.path.lock().unwrap_or_else(|p| p.into_inner()),
                    "expansions": s.expansions,
                    "cow_faults": s.cow_faults,
                    "cow_units": s.cow_units,
                    "read_faults": s.read_faults,
                    "guest_write_exits": s.guest_hook_faults,
                    "guest_writes_already_writable": s.guest_writes_already_writable,
                    "uffd_write_faults": s.uffd_write_faults,
                    "segv_write_faults": s.segv_faults,
                    "segv_served_in_handler": s.segv_in_handler,
                }))
            })
            .collect()
    }

    /// Acknowledges the guest's writes (the sync point of each image).
    pub fn flush(&self) -> anyhow::Result<()> {
        for (n, slot) in self.slots.iter().enumerate() {
            slot.handle().flush().with_context(|| {
                format!(
                    "cannot flush --pmem image {}; its last writes may be lost",
                    self.path(n).display()
                )
            })?;
        }
        Ok(())
    }
}
