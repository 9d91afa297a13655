//! 16550A UART (vm-superio) on COM1, output to any writer, interrupts through an eventfd.

use crate::{BusDevice, GuestRequest};
use std::io::Write;
use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

/// COM1 base port.
pub const COM1_BASE: u64 = 0x3f8;
/// Number of UART registers.
pub const SERIAL_LEN: u64 = 8;
/// Legacy IRQ line of COM1.
pub const COM1_GSI: u32 = 4;

/// A [`Trigger`] that signals an eventfd (registered by the VMM as a KVM irqfd).
pub struct EventFdTrigger(pub EventFd);

impl Trigger for EventFdTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// A UART's saved state: DLL, DLM, IER, IIR, LCR, LSR, MCR, MSR, SCR and the bytes the
/// guest has not read yet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialSnapshot {
    /// The nine registers in the order above.
    pub registers: [u8; 9],
    /// Received bytes not yet read by the guest.
    pub in_buffer: Vec<u8>,
}

/// The COM1 UART as a bus device.
pub struct Serial {
    uart: vm_superio::Serial<EventFdTrigger, vm_superio::serial::NoEvents, Box<dyn Write + Send>>,
}

impl Serial {
    /// A UART that writes guest output to `out` and signals `irq` on interrupts.
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: vm_superio::Serial::new(EventFdTrigger(irq), out),
        }
    }

    /// The UART's registers and receive buffer (for a snapshot).
    pub fn state(&self) -> SerialSnapshot {
        let st = self.uart.state();
        SerialSnapshot {
            registers: [
                st.baud_divisor_low,
                st.baud_divisor_high,
                st.interrupt_enable,
                st.interrupt_identification,
                st.line_control,
                st.line_status,
                st.modem_control,
                st.modem_status,
                st.scratch,
            ],
            in_buffer: st.in_buffer,
        }
    }

    /// A UART restored from a snapshot's state; a receive buffer longer than the UART's
    /// FIFO is refused.
    pub fn from_state(
        irq: EventFd,
        out: Box<dyn Write + Send>,
        state: &SerialSnapshot,
    ) -> Result<Self, String> {
        let [baud_divisor_low, baud_divisor_high, interrupt_enable, interrupt_identification, line_control, line_status, modem_control, modem_status, scratch] =
            state.registers;
        let st = vm_superio::serial::SerialState {
            baud_divisor_low,
            baud_divisor_high,
            interrupt_enable,
            interrupt_identification,
            line_control,
            line_status,
            modem_control,
            modem_status,
            scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let uart = vm_superio::Serial::from_state(
            &st,
            EventFdTrigger(irq),
            vm_superio::serial::NoEvents,
            out,
        )
        .map_err(|e| format!("serial state: {e:?}"))?;
        Ok(Self { uart })
    }

    /// Queues bytes for the guest to read (console input).
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.uart.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(first), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Option<GuestRequest> {
        if let (Some(&value), Ok(off)) = (data.first(), u8::try_from(offset)) {
            if let Err(err) = self.uart.write(off, value) {
                tracing::warn!("serial write failed: {err:?}");
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmits_bytes() {
        let sink = Sink::default();
        let mut serial = Serial::new(EventFd::new(0).unwrap(), Box::new(sink.clone()));
        for b in b"hi\n" {
            serial.write(0, &[*b]);
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"hi\n");
        // Line status register reports the transmitter empty.
        let mut lsr = [0u8];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }
}
