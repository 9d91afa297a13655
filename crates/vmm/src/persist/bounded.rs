//! Length-capped sequences for untrusted state files: a list longer than its cap is
//! refused while it is parsed, before the elements past the cap are built (a 40-byte JSON
//! element can become kilobytes of vCPU state in memory).

use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// Deserializes a `Vec<T>` of at most `N` elements (`#[serde(deserialize_with =
/// "bounded::vec::<_, _, N>")]`).
pub fn vec<'de, D, T, const N: usize>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Capped<T, const N: usize>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Capped<T, N> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {N} entries")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(N));
            while let Some(item) = seq.next_element()? {
                if out.len() == N {
                    return Err(A::Error::custom(format!(
                        "more than {N} entries in a list that holds at most {N}"
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Capped::<T, N>(PhantomData))
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize, Debug)]
    struct S {
        #[serde(deserialize_with = "super::vec::<_, _, 3>")]
        v: Vec<u32>,
    }

    #[test]
    fn lists_past_their_cap_are_refused() {
        let ok: S = serde_json::from_str(r#"{"v":[1,2,3]}"#).unwrap();
        assert_eq!(ok.v, [1, 2, 3]);
        let e = serde_json::from_str::<S>(r#"{"v":[1,2,3,4]}"#).unwrap_err();
        assert!(e.to_string().contains("more than 3 entries"), "{e}");
    }
}
