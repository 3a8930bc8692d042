//! A small seeded random number generator for the random constructors.
//!
//! xoshiro256** (Blackman and Vigna), seeded by expanding the 64-bit seed with
//! splitmix64, as its authors recommend. It is written out here rather than
//! taken from `rand` so that a seed names the same tensor forever: `rand`
//! does not promise stable streams across its versions, and a training run's
//! initial weights must not change when a dependency is bumped.
//!
//! Streams are consumed in row-major element order, so element `i` of a tensor
//! is the `i`-th draw (normal draws come in Box-Muller pairs: elements `2j` and
//! `2j + 1` share the `j`-th pair of uniforms). Uniform floats and integers are
//! bit-for-bit identical on every platform; normal values use `ln`, `sin` and
//! `cos` from the platform's math library and so are identical for one build
//! and may differ in the last bit between platforms.

/// xoshiro256** state.
#[derive(Debug, Clone)]
pub(crate) struct Xoshiro256 {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Xoshiro256 {
    pub(crate) fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        // splitmix64 is a bijection of its counter, so four consecutive outputs
        // are never all zero (the one state xoshiro must avoid).
        Xoshiro256 { s }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, 1)` with 24 random bits.
    pub(crate) fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in `[0, range)` without bias (Lemire's multiply-and-reject).
    /// `range` must be nonzero.
    pub(crate) fn below(&mut self, range: u64) -> u64 {
        let threshold = range.wrapping_neg() % range;
        loop {
            let m = (self.next_u64() as u128) * (range as u128);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Two independent standard normal values (Box-Muller).
    pub(crate) fn normal_pair(&mut self) -> (f64, f64) {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        (r * theta.cos(), r * theta.sin())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_first_outputs() {
        // splitmix64 from state 0: the reference implementation's first output.
        let mut sm = 0u64;
        assert_eq!(splitmix64(&mut sm), 0xE220_A839_7B1D_CDAF);
        // A fixed seed gives a fixed stream; pin the first values so a change
        // to the generator (which would change every seeded tensor) is caught.
        // (Values from an independent transcription of the reference C code.)
        let mut a = Xoshiro256::seed_from_u64(42);
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(
            first,
            vec![
                0x1578_0B2E_0C2E_C716,
                0x6104_D986_6D11_3A7E,
                0xAE17_5332_39E4_99A1,
                0xECB8_AD47_03B3_60A1
            ]
        );
        let mut c = Xoshiro256::seed_from_u64(43);
        assert_ne!(first[0], c.next_u64());
    }

    #[test]
    fn uniform_ranges_and_moments() {
        let mut r = Xoshiro256::seed_from_u64(7);
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        for _ in 0..1000 {
            let x = r.next_f32();
            assert!((0.0..1.0).contains(&x));
            assert!(r.below(10) < 10);
        }
    }

    #[test]
    fn normal_moments() {
        let mut r = Xoshiro256::seed_from_u64(11);
        let n = 50_000;
        let (mut s1, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let (a, b) = r.normal_pair();
            s1 += a + b;
            s2 += a * a + b * b;
        }
        let mean = s1 / (2 * n) as f64;
        let var = s2 / (2 * n) as f64 - mean * mean;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }
}
