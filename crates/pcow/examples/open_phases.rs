//! Times the phases of opening a large image (development aid): `open_phases FILE`.
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let path = std::env::args().nth(1).expect("usage: open_phases FILE");
    for _ in 0..3 {
        let t = Instant::now();
        let st: Arc<dyn pcow::Storage> =
            Arc::new(pcow::FileStorage::open(path.as_ref(), false).unwrap());
        let img = pcow::Image::open(st, false).unwrap();
        let t1 = t.elapsed();
        let c = pcow::Chain::from_images(vec![img], false).unwrap();
        let t2 = t.elapsed();
        println!("scan {:?} total {:?} ({} layers)", t1, t2, c.layer_count());
    }
}
