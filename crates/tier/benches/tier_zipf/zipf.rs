//! The request stream: a seeded xorshift generator, Gray et al.'s zipfian generator and
//! the FNV-1a hash that scrambles ranks into keys.

/// xorshift64*.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipfian ranks in [0, n) with exponent θ, by Gray et al.'s method ("Quickly generating
/// billion-record synthetic databases", 1994), the one YCSB's ZipfianGenerator uses.
pub(crate) struct Zipf {
    n: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    pub(crate) fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |n: u64| (1..=n).map(|i| (i as f64).powf(-theta)).sum::<f64>();
        let (zetan, zeta2) = (zeta(n), zeta(2));
        Zipf {
            n: n as f64,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    pub(crate) fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n as u64 - 1)
    }
}

/// FNV-1a, 64 bits, of a word's little-endian bytes.
fn fnv1a64(v: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of each rank: keys in FNV-1a-64 order of their number (a fixed permutation, so
/// every key keeps exactly one rank and hot keys land on unrelated pages).
pub(crate) fn scramble(keys: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..keys as u32).collect();
    v.sort_by_key(|&k| fnv1a64(u64::from(k)));
    v
}
