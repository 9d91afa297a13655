//! x86_64 CPU state set-up: GDT, identity page tables, long-mode registers and CPUID.

pub mod acpi;
pub mod cpuid;
pub mod gdt;
pub mod paging;
pub mod regs;
pub mod vmgenid;
