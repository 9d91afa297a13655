//! How devices reach the guest. densevm uses virtio-pci (modern, MSI-X): stock distribution
//! kernels find it through `virtio_pci` with no firmware description, where virtio-mmio would
//! need ACPI tables or a command-line option that Debian's kernels do not build.
pub mod pci;
