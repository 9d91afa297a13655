//! The control loop's side of pause, resume, snapshots and clone templates.

use super::ram::{create_ram_file, matches_template, remap, write_memory, write_windows, RamFile};
use super::{RegionRecord, SnapshotState, MEMORY_FILE, STATE_FILE};
use crate::balloon::lock_ram;
use crate::control::{ControlError, ControlRequest, RunState, SnapshotInfo, Template};
use crate::persist::{self, HostCpu};
use crate::vmm::Vmm;
use crate::vstate::kick;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long vCPUs get to park, and to save their state once parked.
const PARK_TIMEOUT: Duration = Duration::from_secs(2);
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(5);

fn failed(what: &str) -> impl Fn(std::io::Error) -> ControlError + '_ {
    move |e| ControlError::Failed(format!("{what}: {e}"))
}

/// Creates `dir` (its parent must exist); an existing directory must be empty.
fn prepare_dir(dir: &Path) -> Result<(), ControlError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ControlError::Conflict(format!(
                    "{} is not empty; give a new or empty directory as snapshot_path",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(|e| {
                ControlError::Failed(format!(
                    "cannot create the snapshot directory {}: {e}",
                    dir.display()
                ))
            })
        }
        Err(e) => Err(ControlError::Failed(format!("{}: {e}", dir.display()))),
    }
}

impl Vmm {
    /// Serves one control request.
    pub(crate) fn handle_control(&mut self, request: ControlRequest, threads: &[JoinHandle<()>]) {
        match request {
            ControlRequest::Pause(reply) => {
                let _ = reply.send(self.user_pause(threads));
            }
            ControlRequest::Resume(reply) => {
                let result = if self.paused {
                    self.paused = false;
                    self.shared.pause.resume();
                    Ok(())
                } else {
                    Err(ControlError::Conflict(
                        "the VM is not paused; nothing to resume".into(),
                    ))
                };
                let _ = reply.send(result);
            }
            ControlRequest::State(reply) => {
                let _ = reply.send(Ok(if self.paused {
                    RunState::Paused
                } else {
                    RunState::Running
                }));
            }
            ControlRequest::Snapshot(dir, reply) => {
                let _ = reply.send(self.with_pause(threads, |vmm| vmm.full_snapshot(&dir)));
            }
            ControlRequest::Template(dir, hook, reply) => {
                let t0 = Instant::now();
                let result = self.with_pause(threads, |vmm| {
                    tracing::debug!("template: vCPUs parked after {:?}", t0.elapsed());
                    vmm.template(&dir, hook)
                });
                tracing::debug!("template: done, VM resumed after {:?}", t0.elapsed());
                let _ = reply.send(result);
            }
        }
    }

    fn kick_all(threads: &[JoinHandle<()>]) -> impl Fn() + '_ {
        move || {
            for handle in threads.iter().filter(|h| !h.is_finished()) {
                kick::kick(handle.as_pthread_t());
            }
        }
    }

    /// Parks every vCPU (idempotent: pausing a paused VM succeeds).
    fn user_pause(&mut self, threads: &[JoinHandle<()>]) -> Result<(), ControlError> {
        if self.paused {
            return Ok(());
        }
        if !self
            .shared
            .pause
            .pause(Self::kick_all(threads), PARK_TIMEOUT)
        {
            self.shared.pause.resume();
            return Err(ControlError::Failed(format!(
                "the vCPUs did not stop within {PARK_TIMEOUT:?}; the VM keeps running"
            )));
        }
        self.paused = true;
        Ok(())
    }

    /// Runs `work` with the VM paused, restoring the run state the VM had before.
    fn with_pause<T>(
        &mut self,
        threads: &[JoinHandle<()>],
        work: impl FnOnce(&mut Self) -> Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        let was_paused = self.paused;
        self.user_pause(threads)?;
        let result = work(self);
        self.devices.resume_virtio();
        if !was_paused {
            self.paused = false;
            self.shared.pause.resume();
        }
        result
    }

    /// Saves the state of every vCPU (on their own threads), the VM and the UART.
    fn capture_state(&mut self) -> Result<SnapshotState, ControlError> {
        // Devices first: once quiesced they complete nothing more, so no interrupt can reach
        // the irqchip after it is saved. They stay quiesced until `with_pause` resumes them.
        let (pci, virtio) = self.devices.save_pci().map_err(ControlError::Unsupported)?;
        // A snapshot refers to each external region's image, which must then hold what the
        // guest wrote (virtio-pmem flushed it when quiesced; a probe has no device).
        for flush in &self.external_flush {
            flush().map_err(|e| {
                ControlError::Failed(format!("flushing a --pmem image before the snapshot: {e}"))
            })?;
        }
        let kvm = Arc::new(kvm_ioctls::Kvm::new().map_err(|e| {
            ControlError::Failed(format!("cannot open /dev/kvm for the MSR list: {e}"))
        })?);
        self.shared.capture.post(Arc::new(move |_, fd| {
            // Finish an I/O exit the guest is waiting on (KVM completes it on the next
            // entry), so the saved registers hold the instruction's result.
            fd.set_kvm_immediate_exit(1);
            let _ = fd.run();
            fd.set_kvm_immediate_exit(0);
            persist::save_vcpu(fd, &kvm).map_err(|e| e.to_string())
        }));
        self.shared.pause.poke();
        let vcpus = self
            .shared
            .capture
            .wait(CAPTURE_TIMEOUT)
            .map_err(ControlError::Failed)?;
        let vm = persist::save_vm(self.vm.fd(), self.vm.has_irqchip())
            .map_err(|e| ControlError::Failed(e.to_string()))?;
        let legacy = self.devices.save_legacy();
        Ok(SnapshotState {
            densevm_version: env!("CARGO_PKG_VERSION").to_string(),
            host_cpu: HostCpu::current(),
            memory_bytes: self.memory_bytes,
            regions: self
                .memory
                .regions()
                .iter()
                .map(|r| RegionRecord {
                    name: r.name.clone(),
                    gpa: r.gpa,
                    size: r.size,
                    external: r.kind == crate::memory::RegionKind::External,
                })
                .collect(),
            irqchip: self.vm.has_irqchip(),
            linux: self.linux,
            vm,
            vcpus,
            legacy,
            pci,
            virtio,
            device_specs: self.device_specs.clone(),
            balloon: self.balloon.as_ref().map(|b| b.config),
        })
    }

    fn write_state_file(dir: &Path, state: &SnapshotState) -> Result<(), ControlError> {
        persist::write_state(&dir.join(STATE_FILE), state)
            .map_err(|e| ControlError::Failed(e.to_string()))
    }

    /// A full snapshot: state + sparse memory file, both durable when this returns.
    fn full_snapshot(&mut self, dir: &Path) -> Result<SnapshotInfo, ControlError> {
        let t0 = Instant::now();
        prepare_dir(dir)?;
        let state = self.capture_state()?;
        let out =
            File::create(dir.join(MEMORY_FILE)).map_err(failed("creating the memory file"))?;
        // The devices are quiesced (no balloon release runs): the lock is free.
        let memory_bytes = write_memory(self.memory.regions(), &lock_ram(&self.ram), &out)
            .map_err(failed("writing guest memory"))?;
        out.sync_all().map_err(failed("syncing the memory file"))?;
        Self::write_state_file(dir, &state)?;
        Ok(SnapshotInfo {
            dir: dir.to_path_buf(),
            memory_bytes,
            paused_for: t0.elapsed(),
        })
    }

    /// Freezes the RAM file as a clone template. A VM whose RAM is its own shared file
    /// costs nothing here, nor does one that wrote nothing since its last template (it is
    /// cloned from that one again); one whose RAM is anonymous or private over an earlier
    /// template with pages of its own first gets a new RAM file with its current contents
    /// (a copy of its resident memory).
    fn template(
        &mut self,
        dir: &Path,
        hook: crate::control::TemplateHook,
    ) -> Result<Template, ControlError> {
        let t0 = Instant::now();
        prepare_dir(dir)?;
        let state = self.capture_state()?;
        tracing::debug!("template: state captured after {:?}", t0.elapsed());
        // Held until RAM is remapped and `ram` describes the new mapping: a balloon release
        // in between would punch a hole into the file the clones are about to map. (The
        // devices are quiesced, so no release waits for it now; see crate::balloon.)
        let shared_ram = self.ram.clone();
        let mut ram = lock_ram(&shared_ram);
        let unchanged = matches_template(self.memory.regions(), &ram)
            .map_err(failed("reading the page map of guest RAM"))?;
        // The template's file must hold all of RAM: a tier gives its pages back and ends.
        let returned = ram
            .end_tier()
            .map_err(failed("moving tiered pages back into the RAM file"))?;
        if returned > 0 {
            tracing::debug!("template: {returned} bytes came back from the memory tier");
        }
        let file = match (&ram.file, ram.shared) {
            (Some(file), true) => {
                write_windows(self.memory.regions(), file)
                    .map_err(failed("copying the boot-image windows into the template"))?;
                file.clone()
            }
            // Nothing written since the last template (a VM kept paused): clone from it.
            (Some(file), false) if unchanged => file.clone(),
            _ => {
                let file = create_ram_file(self.memory.end())
                    .map_err(failed("creating a RAM file for the template"))?;
                write_memory(self.memory.regions(), &ram, &file)
                    .map_err(failed("copying guest memory into the template"))?;
                Arc::new(file)
            }
        };
        persist::write_state_volatile(&dir.join(STATE_FILE), &state)
            .map_err(|e| ControlError::Failed(e.to_string()))?;
        tracing::debug!("template: state written after {:?}", t0.elapsed());
        // Clones may be running once the hook returns (even if it fails): the VM's own RAM
        // leaves the file whatever the outcome, so nobody writes the template again.
        let hooked = hook(file.as_fd());
        tracing::debug!("template: hook done after {:?}", t0.elapsed());
        // RAM and the boot-image windows (whose bytes the template holds at their guest
        // addresses) go private over it: what the VM writes from now on is its own, and
        // a VM that writes nothing can be cloned again from the same file.
        let frozen = self
            .memory
            .regions()
            .iter()
            .filter(|r| r.kind != crate::memory::RegionKind::External);
        for r in frozen {
            if let Err(e) = remap(r, &file, false) {
                // Part of the VM's RAM still writes the file the clones map: it must not
                // run again.
                tracing::error!("freezing guest RAM failed ({e}); stopping the VM");
                self.shared
                    .stop
                    .store(true, std::sync::atomic::Ordering::Release);
                return Err(failed("freezing guest RAM (the VM is stopped)")(e));
            }
        }
        let holes = crate::snapshot::holes::cover_holes(self.memory.regions(), &file);
        *ram = RamFile::new(Some(file), false);
        ram.set_anon_holes(holes);
        drop(ram);
        tracing::debug!("template: RAM frozen after {:?}", t0.elapsed());
        hooked.map_err(ControlError::Failed)?;
        // The hook may have moved external regions onto new images (clones' overlays):
        // their read-only ranges changed while the vCPUs are parked.
        self.readonly_slots
            .sync(&mut self.vm)
            .map_err(|e| ControlError::Failed(format!("re-registering --pmem slots: {e}")))?;
        Ok(Template {
            dir: PathBuf::from(dir),
            paused_for: t0.elapsed(),
        })
    }
}
