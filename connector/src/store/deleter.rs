//! Deletes spent segment files off the message path, a few MiB at a time. A segment is renamed
//! out of the log at once (so a crash never brings it back as a segment), then shrunk step by
//! step on a thread of its own and removed: freeing a whole 64 MiB segment in one call (with the
//! `discard` mount option, a synchronous TRIM) held the log's fdatasyncs for 20–30 ms and the
//! runtime thread that made the call with them.

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Bytes freed per step.
const STEP: u64 = 4 * 1024 * 1024;
/// Pause between steps, so the log's syncs go between them.
const PAUSE: Duration = Duration::from_millis(5);
/// What a spent segment is renamed to end with.
pub const SPENT_SUFFIX: &str = ".spent";

/// The thread that deletes spent files.
pub struct Deleter {
    tx: Mutex<Option<mpsc::Sender<PathBuf>>>,
    /// Set when the store closes: what is left is removed without pauses.
    hurry: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Deleter {
    /// Starts the deleting thread.
    pub fn start() -> io::Result<Deleter> {
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let hurry = Arc::new(AtomicBool::new(false));
        let h = hurry.clone();
        let thread = std::thread::Builder::new()
            .name("store-deleter".into())
            .spawn(move || {
                while let Ok(path) = rx.recv() {
                    shrink_and_remove(&path, &h);
                }
            })?;
        Ok(Deleter {
            tx: Mutex::new(Some(tx)),
            hurry,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Takes `segment` out of the log at once (renamed to end in [`SPENT_SUFFIX`]) and deletes
    /// it in the background.
    pub fn delete(&self, segment: &Path) -> io::Result<()> {
        let spent = spent_path(segment);
        std::fs::rename(segment, &spent)?;
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        // Closed: deleted here, at once.
        let Some(tx) = tx.as_ref() else {
            return std::fs::remove_file(spent);
        };
        tx.send(spent)
            .or_else(|mpsc::SendError(spent)| std::fs::remove_file(spent))
    }

    /// Removes what is still waiting, without pauses, and stops the thread.
    pub fn close(&self) {
        self.hurry.store(true, Ordering::Relaxed);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// The name a spent `segment` is renamed to.
fn spent_path(segment: &Path) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(SPENT_SUFFIX);
    PathBuf::from(name)
}

/// Shrinks the file at `path` by [`STEP`] at a time, pausing between steps unless told to
/// `hurry`, then removes it.
fn shrink_and_remove(path: &Path, hurry: &AtomicBool) {
    if let Ok(f) = OpenOptions::new().write(true).open(path) {
        let mut len = f.metadata().map_or(0, |m| m.len());
        while len > STEP && !hurry.load(Ordering::Relaxed) {
            len -= STEP;
            if f.set_len(len).is_err() {
                break;
            }
            std::thread::sleep(PAUSE);
        }
    }
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "could not delete a spent segment");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deleted segment leaves the log's name at once and the directory soon after; a closed
    /// deleter deletes inline.
    #[test]
    fn spent_segments_go_in_the_background() {
        let dir = tempfile::tempdir().expect("dir");
        let seg = dir.path().join("seg-0000000001.log");
        std::fs::write(&seg, vec![7u8; (2 * STEP + 10) as usize]).expect("write");
        let d = Deleter::start().expect("deleter");
        d.delete(&seg).expect("delete");
        assert!(!seg.exists(), "renamed out of the log at once");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while spent_path(&seg).exists() {
            assert!(std::time::Instant::now() < deadline, "never removed");
            std::thread::sleep(Duration::from_millis(5));
        }
        d.close();
        let seg2 = dir.path().join("seg-0000000002.log");
        std::fs::write(&seg2, b"x").expect("write");
        d.delete(&seg2).expect("delete after close");
        assert!(!seg2.exists() && !spent_path(&seg2).exists());
    }

    /// A spent segment a crash left behind is removed when the log is read at start, and never
    /// read as a segment.
    #[test]
    fn a_leftover_spent_segment_is_removed_at_start() {
        let dir = tempfile::tempdir().expect("dir");
        let leftover = dir.path().join("seg-0000000003.log.spent");
        std::fs::write(&leftover, vec![1u8; 100]).expect("write");
        let mut records = 0;
        let (segments, dropped) =
            crate::store::log::recover(dir.path(), |_, _, _| records += 1).expect("recover");
        assert!(segments.is_empty() && dropped.is_empty() && records == 0);
        assert!(!leftover.exists());
    }
}
