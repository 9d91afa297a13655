# virtio devices (crates/virtio): the device model, virtio-pci and the devices; their unit
# and hostile-driver tests run in `cargo test` (which also replays the fuzz corpora). Their
# fuzz targets (virtqueue, balloon, virtio_net, virtio_vsock, virtio_pmem, virtio_pci) are
# in fuzz/ with the others: mk/fuzz.mk (`make fuzz TARGET=virtio_net SECONDS=600`).
