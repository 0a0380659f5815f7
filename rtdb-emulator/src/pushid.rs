//! Push ids for `POST`: the 20-character, time-ordered child names RTDB generates.
//!
//! Same scheme as the Firebase SDKs: 8 characters of millisecond timestamp followed by 12
//! random characters, in an alphabet whose ASCII order matches its value order, so ids sort
//! by creation time. Ids made in the same millisecond increment the random part instead of
//! drawing a new one, which keeps them strictly increasing.

const ALPHABET: &[u8; 64] = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";

#[derive(Debug, Default)]
pub struct PushIds {
    last_ms: i64,
    last_random: [u8; 12],
}

impl PushIds {
    pub fn next(&mut self, now_ms: i64) -> String {
        // A clock that steps back must not break the ordering of ids already handed out.
        let now = now_ms.max(self.last_ms);
        if now == self.last_ms {
            for digit in self.last_random.iter_mut().rev() {
                if *digit == 63 {
                    *digit = 0;
                } else {
                    *digit += 1;
                    break;
                }
            }
        } else {
            for digit in self.last_random.iter_mut() {
                *digit = fastrand::u8(0..64);
            }
            self.last_ms = now;
        }
        let mut id = [0u8; 20];
        let mut ts = u64::try_from(now).unwrap_or(0);
        for slot in id[..8].iter_mut().rev() {
            *slot = ALPHABET[(ts % 64) as usize];
            ts /= 64;
        }
        for (slot, digit) in id[8..].iter_mut().zip(self.last_random) {
            *slot = ALPHABET[usize::from(digit & 63)];
        }
        id.iter().map(|&b| char::from(b)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_keys_and_strictly_increasing() {
        let mut ids = PushIds::default();
        let mut prev = String::new();
        for now in [5, 5, 5, 4, 1_700_000_000_000, 1_700_000_000_000] {
            let id = ids.next(now);
            assert_eq!(id.len(), 20);
            assert!(crate::tree::check_key(&id).is_ok());
            assert!(id > prev, "{id} should sort after {prev}");
            prev = id;
        }
    }
}
