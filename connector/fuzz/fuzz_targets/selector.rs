//! Selector texts (SEL-5): any input parses within its bounds or is refused with a position
//! inside the text — never a panic, a runaway recursion or an unbounded allocation — and a
//! parsed selector evaluates over arbitrary envelope Metadata without a panic.
#![no_main]

use connector::bridge::selector::{EnvelopeOperands, Selector, MAX_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The selector text, then Metadata to evaluate it on, split at the first NUL.
    let (text, metadata) = match data.iter().position(|b| *b == 0) {
        Some(i) => data.split_at(i),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    match Selector::parse(&text) {
        Ok(sel) => {
            assert!(text.len() <= MAX_BYTES);
            let metadata = String::from_utf8_lossy(metadata);
            let _ = sel.matches(&EnvelopeOperands::new(&metadata));
        }
        Err(e) => assert!(e.at <= text.len().max(MAX_BYTES), "{e}"),
    }
});
