//! PCI: configuration mechanism #1 behind ports 0xcf8–0xcff with a host bridge and the
//! functions densevm adds on bus 0 (virtio devices), a type-0 configuration space with
//! BAR sizing and a capability list, and MSI-X.
//!
//! BARs are assigned by densevm before the guest starts, as firmware would, and stay where
//! they are: the notification eventfds of virtio devices are registered with KVM at those
//! addresses. A guest that writes another address to a BAR is logged and ignored (Linux keeps
//! firmware assignments that fit its resource tree).

mod config;
mod msix;
mod root;
mod state;

pub use config::{ConfigSpace, PciHeader, CAP_ID_MSIX, CAP_ID_VENDOR};
pub use msix::{MsiMessage, MsiRoutes, Msix, MsixVector, MSIX_ENTRY_SIZE};
pub use root::{PciFunction, PciRoot, PCI_CONFIG_BASE, PCI_CONFIG_LEN};
pub use state::{ConfigSpaceState, MsixState, PciRootState, PciStateError};
