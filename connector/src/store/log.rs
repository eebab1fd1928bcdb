//! The append-only log: numbered segment files written under one lock, group commit on the
//! writer thread (every batch waiting while one `fdatasync` runs is written and synced together;
//! a durable send that finds the writer idle writes itself and hands over only the sync),
//! positional reads, recovery with torn-tail truncation, and deletion of whole segments once
//! nothing in them is live.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use bytes::BytesMut;
use tokio::sync::oneshot;

use super::deleter::{Deleter, SPENT_SUFFIX};
use super::record::{self, Parsed, Record};

/// Default size at which a segment is closed and a new one started.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Appends gathered into one write and one sync at most.
const MAX_BATCH: usize = 8192;
/// Most bytes one read of back-to-back records takes (a single larger record is read whole).
const READ_RUN: u64 = 1024 * 1024;

/// Where a record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// Segment number.
    pub segment: u64,
    /// Byte offset of the record's frame in the segment.
    pub offset: u64,
}

/// What recovery found wrong and dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Segment number.
    pub segment: u64,
    /// Offset of the first byte not read.
    pub offset: u64,
    /// Bytes dropped.
    pub bytes: u64,
    /// Why: a torn tail (incomplete record) or a corrupt one.
    pub reason: &'static str,
}

/// What the writer thread is handed.
enum Work {
    /// Records to write, and who waits for them.
    Append(Append),
    /// Records a sender wrote on its own thread, waiting only for their fdatasync.
    Sync(Later),
}

struct Append {
    bytes: BytesMut,
    done: Option<Done>,
}

/// Where the writer's result of an append goes.
type Written = io::Result<(Location, SegmentPin)>;

/// How a segment file reaches the disk: [`File::sync_data`] outside tests.
type SyncFn = fn(&File) -> io::Result<()>;

/// Who is told once an append is on disk.
enum Done {
    /// A caller waiting for the result.
    Tell(oneshot::Sender<Written>),
    /// Work in two steps: `written` runs as soon as the records are in the file (the page cache,
    /// which a killed process keeps) and before the batch's fdatasync, so what makes them
    /// visible does not wait for the disk; `synced` is told how the fdatasync went (a failed
    /// write tells both).
    Early {
        written: Box<dyn FnOnce(Written) + Send>,
        synced: oneshot::Sender<io::Result<()>>,
    },
}

/// Appends per segment whose callers have not yet counted their records live.
type Pins = Arc<Mutex<BTreeMap<u64, u64>>>;

/// Keeps a segment from being deleted until the records just appended to it are counted live:
/// the segment can close (and look spent) before the appender has had its turn to count them.
/// Dropping it releases the segment.
#[derive(Debug)]
pub struct SegmentPin {
    pins: Pins,
    segment: u64,
}

impl SegmentPin {
    fn new(pins: &Pins, segment: u64) -> SegmentPin {
        *pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(segment)
            .or_default() += 1;
        SegmentPin {
            pins: pins.clone(),
            segment,
        }
    }
}

impl Drop for SegmentPin {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pins.get_mut(&self.segment) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.segment);
            }
        }
    }
}

/// Produces the framed record that opens every new segment.
pub type CheckpointFn = Box<dyn Fn() -> BytesMut + Send>;

/// The [`CheckpointFn`] of a log whose in-memory state is `state`: `make` reads it under its lock.
pub fn checkpoints<S: Send + 'static>(
    state: Arc<Mutex<S>>,
    make: fn(&S) -> record::Checkpoint,
) -> CheckpointFn {
    Box::new(move || {
        let cp = make(&state.lock().unwrap_or_else(|e| e.into_inner()));
        let mut b = BytesMut::new();
        record::frame(&mut b, record::Kind::Checkpoint(cp));
        b
    })
}

/// Logs what [`recover`] dropped from the log named `log`.
pub fn warn_dropped(log: &'static str, dropped: &[Dropped]) {
    for d in dropped {
        tracing::warn!(
            log,
            segment = d.segment,
            offset = d.offset,
            bytes = d.bytes,
            reason = d.reason,
            "dropped damaged data"
        );
    }
}

/// The log; cheap to share behind an `Arc`.
pub struct Log {
    dir: PathBuf,
    /// Deletes spent segments off the message path.
    deleter: Deleter,
    tx: Mutex<Option<mpsc::Sender<Work>>>,
    /// The one writer of the segments, taken by the writer thread and by early appends.
    writer: Arc<Mutex<Writer>>,
    /// The writer thread waits for work: an early append writes itself.
    writer_idle: Arc<AtomicBool>,
    files: Arc<Mutex<BTreeMap<u64, Arc<File>>>>,
    active: Arc<AtomicU64>,
    pins: Pins,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("seg-{n:010}.log"))
}

/// Reads every intact record of the existing segments in order, calling `visit` for each;
/// truncates a torn or corrupt tail of the last segment and skips the rest of a damaged earlier
/// one. Returns what was dropped.
pub fn recover(
    dir: &Path,
    mut visit: impl FnMut(Record, Location, u32),
) -> io::Result<(Vec<u64>, Vec<Dropped>)> {
    std::fs::create_dir_all(dir)?;
    let mut segments: Vec<u64> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if name.ends_with(SPENT_SUFFIX) {
                // A spent segment the last run had not finished deleting.
                let _ = std::fs::remove_file(e.path());
                return None;
            }
            name.strip_prefix("seg-")?
                .strip_suffix(".log")?
                .parse()
                .ok()
        })
        .collect();
    segments.sort_unstable();
    let mut dropped = Vec::new();
    for (i, &n) in segments.iter().enumerate() {
        let path = segment_path(dir, n);
        let data = std::fs::read(&path)?;
        let mut pos = 0usize;
        while pos < data.len() {
            match record::parse(data.get(pos..).unwrap_or_default()) {
                Parsed::Record(r, len) => {
                    visit(
                        *r,
                        Location {
                            segment: n,
                            offset: pos as u64,
                        },
                        len as u32,
                    );
                    pos += len;
                }
                bad => {
                    let reason = if bad == Parsed::Incomplete {
                        "torn tail"
                    } else {
                        "corrupt record"
                    };
                    dropped.push(Dropped {
                        segment: n,
                        offset: pos as u64,
                        bytes: (data.len() - pos) as u64,
                        reason,
                    });
                    if i + 1 == segments.len() {
                        // Only the newest segment can have been cut by a crash: cut it cleanly so
                        // nothing after the damage is ever misread.
                        OpenOptions::new()
                            .write(true)
                            .open(&path)?
                            .set_len(pos as u64)?;
                    }
                    break;
                }
            }
        }
    }
    Ok((segments, dropped))
}

impl Log {
    /// Starts the writer on a fresh segment after `existing` ones (from [`recover`]).
    /// `checkpoint` produces the framed record that opens every new segment.
    pub fn start(
        dir: &Path,
        existing: &[u64],
        segment_bytes: u64,
        checkpoint: CheckpointFn,
    ) -> io::Result<Log> {
        Log::start_syncing_with(dir, existing, segment_bytes, checkpoint, File::sync_data)
    }

    /// [`Log::start`] with each batch's fdatasync made by `sync`.
    fn start_syncing_with(
        dir: &Path,
        existing: &[u64],
        segment_bytes: u64,
        checkpoint: CheckpointFn,
        sync: SyncFn,
    ) -> io::Result<Log> {
        let mut files = BTreeMap::new();
        for &n in existing {
            files.insert(n, Arc::new(File::open(segment_path(dir, n))?));
        }
        let first = existing.last().map_or(1, |n| n + 1);
        let files = Arc::new(Mutex::new(files));
        let active = Arc::new(AtomicU64::new(first));
        let pins = Pins::default();
        let (tx, rx) = mpsc::channel::<Work>();
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            files: files.clone(),
            active: active.clone(),
            pins: pins.clone(),
            file: None,
            len: 0,
            segment_bytes,
            broken: false,
            closed: false,
            failed_segments: BTreeSet::new(),
            buf: Vec::new(),
            checkpoint,
            sync,
        };
        writer.roll(first)?;
        let writer = Arc::new(Mutex::new(writer));
        // Idle only once the thread waits for work: work sent before it starts is taken without
        // a wait, and a sender must not write beside it then.
        let writer_idle = Arc::new(AtomicBool::new(false));
        let thread = {
            let (writer, idle) = (writer.clone(), writer_idle.clone());
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || run(&writer, &idle, rx))?
        };
        Ok(Log {
            dir: dir.to_path_buf(),
            deleter: Deleter::start()?,
            tx: Mutex::new(Some(tx)),
            writer,
            writer_idle,
            files,
            active,
            pins,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Appends framed records; resolves once they are on disk, with their segment pinned until
    /// the returned [`SegmentPin`] is dropped (count the records live first).
    pub async fn append(&self, bytes: BytesMut) -> io::Result<(Location, SegmentPin)> {
        let (done, wait) = oneshot::channel();
        self.send(Work::Append(Append {
            bytes,
            done: Some(Done::Tell(done)),
        }))?;
        wait.await
            .map_err(|_| io::Error::other("store writer stopped"))?
    }

    /// [`Log::append`], handed to the writer before this returns (not at the future's first
    /// poll): appends made one after another are written in that order.
    pub fn append_in_order(
        &self,
        bytes: BytesMut,
    ) -> impl std::future::Future<Output = io::Result<(Location, SegmentPin)>> + Send + 'static
    {
        let (done, wait) = oneshot::channel();
        let sent = self.send(Work::Append(Append {
            bytes,
            done: Some(Done::Tell(done)),
        }));
        async move {
            sent?;
            wait.await
                .map_err(|_| io::Error::other("store writer stopped"))?
        }
    }

    /// Appends framed records durably: runs `written` once they are in the file (the page
    /// cache, which a killed process keeps), before their fdatasync, and resolves the returned
    /// receiver with the fdatasync's outcome; `Err` when the log is closed (`written` is not
    /// run). When the writer thread is idle the records are written on the caller's thread and
    /// `written` runs there, sparing the thread's wake-up before they are visible; so the caller
    /// must not hold a lock the log's checkpoint takes (a write can start a new segment).
    pub fn append_early(
        &self,
        bytes: BytesMut,
        written: impl FnOnce(Written) + Send + 'static,
    ) -> io::Result<oneshot::Receiver<io::Result<()>>> {
        let (synced, wait) = oneshot::channel();
        if !self.writer_idle.load(Ordering::Acquire) {
            self.send(Work::Append(Append {
                bytes,
                done: Some(Done::Early {
                    written: Box::new(written),
                    synced,
                }),
            }))?;
            return Ok(wait);
        }
        let w = {
            let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            if writer.closed {
                return Err(io::Error::other("store is closed"));
            }
            writer.write_batch(&[&bytes]).pop()
        };
        let w = w.unwrap_or_else(|| Err(io::Error::other("nothing written")));
        let later = Later::early(synced, &w);
        written(w);
        // Closed since the write: its sync is not known, so it counts as failed.
        if let Err((Work::Sync(later), e)) = self.hand_over(Work::Sync(later)) {
            later.tell(&Err(e));
        }
        Ok(wait)
    }

    /// Appends framed records without waiting and without an fsync of their own (acks: they reach
    /// the disk with the next durable append; one lost in a power failure means a redelivery).
    pub fn append_nowait(&self, bytes: BytesMut) {
        let _ = self.send(Work::Append(Append { bytes, done: None }));
    }

    fn send(&self, w: Work) -> io::Result<()> {
        self.hand_over(w).map_err(|(_, e)| e)
    }

    /// Hands `w` to the writer thread, or gives it back with why not.
    fn hand_over(&self, w: Work) -> Result<(), (Work, io::Error)> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref() {
            Some(tx) => tx
                .send(w)
                .map_err(|e| (e.0, io::Error::other("store writer stopped"))),
            None => Err((w, io::Error::other("store is closed"))),
        }
    }

    /// Reads the record of `len` framed bytes at `loc`.
    pub fn read(&self, loc: Location, len: u32) -> io::Result<Record> {
        self.read_many(&[(loc, len)])
            .pop()
            .unwrap_or_else(|| Err(io::Error::other("nothing read")))
    }

    /// Reads the records at `spans` (location, framed length), one result each, in order.
    /// Records that lie back to back in a segment (a batch that was sent together) are read
    /// with one system call, up to `READ_RUN` bytes, and their bodies share that buffer.
    pub fn read_many(&self, spans: &[(Location, u32)]) -> Vec<io::Result<Record>> {
        let mut out = Vec::with_capacity(spans.len());
        let mut i = 0;
        while let Some(&(start, first)) = spans.get(i) {
            let mut total = u64::from(first);
            let mut end = i + 1;
            while let Some(&(loc, len)) = spans.get(end) {
                if loc.segment != start.segment
                    || loc.offset != start.offset + total
                    || total + u64::from(len) > READ_RUN
                {
                    break;
                }
                total += u64::from(len);
                end += 1;
            }
            match self.read_at(start, total) {
                Ok(buf) => {
                    let mut at = 0;
                    for &(loc, len) in spans.get(i..end).unwrap_or_default() {
                        let len = len as usize;
                        let one = buf.slice(at..at + len);
                        at += len;
                        out.push(match record::parse_shared(&one) {
                            Parsed::Record(r, framed) if framed == len => Ok(*r),
                            _ => Err(io::Error::other(format!(
                                "record at {}:{} does not verify",
                                loc.segment, loc.offset
                            ))),
                        });
                    }
                }
                Err(e) => out.extend((i..end).map(|_| Err(copy_error(&e)))),
            }
            i = end;
        }
        out
    }

    /// `len` bytes of `loc`'s segment from `loc`'s offset.
    fn read_at(&self, loc: Location, len: u64) -> io::Result<bytes::Bytes> {
        let file = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&loc.segment)
            .cloned()
            .ok_or_else(|| io::Error::other(format!("segment {} is gone", loc.segment)))?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, loc.offset)?;
        Ok(buf.into())
    }

    /// The segment being written.
    pub fn active_segment(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Segment numbers currently on disk, oldest first.
    pub fn segments(&self) -> Vec<u64> {
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Whether an append to segment `n` is not yet counted live by its caller. Check it before
    /// the live count: a caller counts first and unpins after.
    pub fn pinned(&self, n: u64) -> bool {
        self.pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&n)
    }

    /// Deletes a closed segment; false when it is the active one, pinned, or already deleted
    /// (two reclaims may race for it).
    pub fn remove(&self, n: u64) -> io::Result<bool> {
        if n >= self.active_segment() || self.pinned(n) {
            return Ok(false);
        }
        let known = self
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n)
            .is_some();
        if known {
            self.deleter.delete(&segment_path(&self.dir, n))?;
        }
        Ok(known)
    }

    /// Stops the writer after it has written and synced everything queued.
    pub fn close(&self) {
        self.writer.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // The writer itself can drop the last handle on the store, in the work an append
            // runs after its write: it ends on its own once the queue is empty.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        self.deleter.close();
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.close();
    }
}

struct Writer {
    dir: PathBuf,
    files: Arc<Mutex<BTreeMap<u64, Arc<File>>>>,
    active: Arc<AtomicU64>,
    pins: Pins,
    /// The active segment, shared with the fdatasync made outside the lock.
    file: Option<Arc<File>>,
    len: u64,
    segment_bytes: u64,
    /// A write or an fdatasync failed: the active segment can no longer be trusted.
    broken: bool,
    /// The log is closed: nothing more is written on a sender's thread.
    closed: bool,
    /// The segments whose fdatasync failed, or that were closed broken: what was written to
    /// them and not yet synced is never reported on disk (another fdatasync of the same file can
    /// succeed without the pages the failed one lost). Only failures add to it.
    failed_segments: BTreeSet<u64>,
    /// A batch's bytes, gathered for one write.
    buf: Vec<u8>,
    checkpoint: CheckpointFn,
    /// Makes an fdatasync.
    sync: SyncFn,
}

/// Who hears of a batch's fdatasync, with what the write gave it.
enum Later {
    /// A caller of [`Log::append`], told the location once it is on disk.
    Tell(oneshot::Sender<Written>, Written),
    /// A caller of [`Log::append_early`], told how the fdatasync (or the write) of the records
    /// it wrote to `segment` went.
    Synced {
        synced: oneshot::Sender<io::Result<()>>,
        written: io::Result<()>,
        segment: u64,
    },
}

impl Later {
    /// The waiter of an early append whose write gave `w`.
    fn early(synced: oneshot::Sender<io::Result<()>>, w: &Written) -> Later {
        Later::Synced {
            synced,
            written: w.as_ref().map(|_| ()).map_err(copy_error),
            segment: w.as_ref().map_or(0, |(loc, _)| loc.segment),
        }
    }

    fn was_written(&self) -> bool {
        match self {
            Later::Tell(_, w) => w.is_ok(),
            Later::Synced { written, .. } => written.is_ok(),
        }
    }

    /// The segment its records went to (0 when the write failed).
    fn segment(&self) -> u64 {
        match self {
            Later::Tell(_, w) => w.as_ref().map_or(0, |(loc, _)| loc.segment),
            Later::Synced { segment, .. } => *segment,
        }
    }

    /// Tells the waiter its write's result as the sync `synced` leaves it.
    fn tell(self, synced: &io::Result<()>) {
        // A caller that gave up drops the pin with the message.
        match self {
            Later::Tell(done, w) => {
                let _ = done.send(after_sync(synced, w));
            }
            Later::Synced {
                synced: done,
                written,
                ..
            } => {
                let _ = done.send(after_sync(synced, written));
            }
        }
    }
}

/// A write's result once its batch's fdatasync is done: a failed sync fails every write.
fn after_sync<T>(synced: &io::Result<()>, written: io::Result<T>) -> io::Result<T> {
    match (synced, written) {
        (Err(e), Ok(_)) => Err(copy_error(e)),
        (_, w) => w,
    }
}

/// The same failure again, for each append of a batch (`io::Error` is not `Clone`).
fn copy_error(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// The writer thread: writes what is handed to it in batches under the writer's lock, then runs
/// one fdatasync for the batch and for the records senders wrote themselves before it began.
/// Senders that find it busy hand it their records, which form its next batch.
fn run(writer: &Mutex<Writer>, idle: &AtomicBool, rx: mpsc::Receiver<Work>) {
    loop {
        let first = match rx.try_recv() {
            Ok(w) => w,
            Err(mpsc::TryRecvError::Disconnected) => break,
            Err(mpsc::TryRecvError::Empty) => {
                idle.store(true, Ordering::Release);
                let got = rx.recv();
                idle.store(false, Ordering::Release);
                match got {
                    Ok(w) => w,
                    Err(_) => break,
                }
            }
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let mut appends = Vec::with_capacity(batch.len());
        let mut later = Vec::new();
        for w in batch {
            match w {
                Work::Append(a) => appends.push(a),
                Work::Sync(who) => later.push(who),
            }
        }
        let parts: Vec<&[u8]> = appends.iter().map(|a| &a.bytes[..]).collect();
        let (written, file, active, sync) = {
            let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
            let written = w.write_batch(&parts);
            let active = w.active.load(Ordering::Acquire);
            (written, w.file.clone(), active, w.sync)
        };
        // What may follow the write runs before the sync: the fdatasync then overlaps the
        // hand-out of the records to whoever waits for them.
        for (a, w) in appends.into_iter().zip(written) {
            match a.done {
                Some(Done::Early { written, synced }) => {
                    later.push(Later::early(synced, &w));
                    written(w);
                }
                Some(Done::Tell(done)) => later.push(Later::Tell(done, w)),
                None => {}
            }
        }
        // Only a batch someone waits on is fsynced. Records nobody waits for (settlements)
        // are written, so a killed process keeps them, and reach the disk with the next
        // fsync; a power loss before that redelivers those messages, which at-least-once
        // allows. The sync runs outside the lock: only the active segment can hold records
        // not yet synced (closing a segment syncs it).
        let synced = match file {
            Some(f) if later.iter().any(Later::was_written) => sync(&f),
            _ => Ok(()),
        };
        // The waiters' segments that cannot be trusted (failed now or before).
        let failed: Vec<u64> = {
            let mut w = writer.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = &synced {
                tracing::error!(error = %e, segment = active, "store sync failed");
                if w.active.load(Ordering::Acquire) == active {
                    w.broken = true;
                }
                w.failed_segments.insert(active);
            }
            later
                .iter()
                .map(Later::segment)
                .filter(|s| w.failed_segments.contains(s))
                .collect()
        };
        for who in later {
            let segment = who.segment();
            if failed.contains(&segment) {
                who.tell(&Err(io::Error::other(
                    "an fdatasync of this segment failed",
                )));
            } else if segment == active {
                who.tell(&synced);
            } else {
                // Closed (and synced) since it was written, or nothing was written.
                who.tell(&Ok(()));
            }
        }
    }
    let w = writer.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = w.file.as_ref() {
        let _ = (w.sync)(f);
    }
}

impl Writer {
    fn roll(&mut self, n: u64) -> io::Result<()> {
        // A broken segment's sync proves nothing (after a failed fdatasync the next one of the
        // same file can succeed without the lost pages), and a failing one must not keep the
        // log from moving on to a new segment.
        match (self.file.as_ref(), self.broken) {
            (Some(f), false) => (self.sync)(f)?,
            (Some(_), true) => {
                self.failed_segments
                    .insert(self.active.load(Ordering::Acquire));
            }
            (None, _) => {}
        }
        let path = segment_path(&self.dir, n);
        let f = OpenOptions::new().create(true).append(true).open(&path)?;
        let cp = (self.checkpoint)();
        (&f).write_all(&cp)?;
        f.sync_data()?;
        // The directory entry must be durable too, or the segment may vanish in a crash.
        File::open(&self.dir)?.sync_all()?;
        self.files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(n, Arc::new(File::open(&path)?));
        self.len = cp.len() as u64;
        self.file = Some(Arc::new(f));
        self.active.store(n, Ordering::Release);
        Ok(())
    }

    /// Writes a batch (without its sync); each append gets its location, pinned (before a
    /// later append of the batch can close the segment), or the error.
    fn write_batch(&mut self, batch: &[&[u8]]) -> Vec<Written> {
        let mut buf = std::mem::take(&mut self.buf);
        let written = self.write_through(batch, &mut buf);
        self.buf = buf;
        written
    }

    fn write_through(&mut self, batch: &[&[u8]], buf: &mut Vec<u8>) -> Vec<Written> {
        let mut locs = Vec::with_capacity(batch.len());
        buf.clear();
        let mut failed: Option<io::Error> = None;
        if self.broken {
            let next = self.active.load(Ordering::Acquire) + 1;
            if let Err(e) = self.roll(next) {
                return batch.iter().map(|_| Err(copy_error(&e))).collect();
            }
            self.broken = false;
        }
        for bytes in batch {
            if self.len + buf.len() as u64 > self.segment_bytes {
                let next = self.active.load(Ordering::Acquire) + 1;
                if let Err(e) = self.flush(buf).and_then(|_| self.roll(next)) {
                    failed = Some(e);
                    break;
                }
            }
            let segment = self.active.load(Ordering::Acquire);
            locs.push((
                Location {
                    segment,
                    offset: self.len + buf.len() as u64,
                },
                SegmentPin::new(&self.pins, segment),
            ));
            buf.extend_from_slice(bytes);
        }
        let flushed = match failed {
            Some(e) => Err(e),
            None => self.flush(buf),
        };
        match flushed {
            Ok(()) => locs.into_iter().map(Ok).collect(),
            Err(e) => {
                tracing::error!(error = %e, "store write failed");
                self.broken = true;
                batch.iter().map(|_| Err(copy_error(&e))).collect()
            }
        }
    }

    fn flush(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let mut f: &File = self
            .file
            .as_deref()
            .ok_or_else(|| io::Error::other("no active segment"))?;
        f.write_all(buf)?;
        self.len += buf.len() as u64;
        buf.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubemq::QueueMessage;
    use crate::store::record::{frame, Enqueue, Kind};

    fn enqueue(buf: &mut BytesMut, body: &str) -> u32 {
        let message = QueueMessage {
            body: body.as_bytes().to_vec().into(),
            ..Default::default()
        };
        frame(
            buf,
            Kind::Enqueue(Enqueue {
                message: Some(message),
            }),
        ) as u32
    }

    fn body(r: &io::Result<Record>) -> Option<Vec<u8>> {
        match r {
            Ok(Record {
                kind: Some(Kind::Enqueue(Enqueue { message: Some(m) })),
            }) => Some(m.body.to_vec()),
            _ => None,
        }
    }

    /// A segment closed by a later append is not deleted while an append to it is not yet
    /// counted live (its pin is held), and deleting it twice is no error.
    #[tokio::test]
    async fn a_pinned_segment_outlives_its_close() {
        let dir = tempfile::tempdir().expect("dir");
        let log = Log::start(dir.path(), &[], 256, Box::new(BytesMut::new)).expect("log");
        let body = "x".repeat(300);
        let mut buf = BytesMut::new();
        enqueue(&mut buf, &body);
        let (a, pin) = log.append(buf).await.expect("append");
        let mut buf = BytesMut::new();
        enqueue(&mut buf, &body);
        let (b, _b_pin) = log.append(buf).await.expect("append");
        assert!(
            b.segment > a.segment,
            "the second append closed the first segment"
        );
        assert!(log.pinned(a.segment));
        assert!(!log.remove(a.segment).expect("remove"), "pinned: kept");
        drop(pin);
        assert!(!log.pinned(a.segment));
        assert!(
            log.remove(a.segment).expect("remove"),
            "deleted once counted"
        );
        assert!(
            !log.remove(a.segment).expect("remove again"),
            "already gone"
        );
    }

    /// An early append's records are readable in the step that runs before their fdatasync,
    /// which is reported afterwards; once the log is closed, nothing runs.
    #[tokio::test]
    async fn an_early_append_is_readable_before_its_sync_is_reported() {
        let dir = tempfile::tempdir().expect("dir");
        let log = Arc::new(
            Log::start(dir.path(), &[], SEGMENT_BYTES, Box::new(BytesMut::new)).expect("log"),
        );
        let mut buf = BytesMut::new();
        let len = enqueue(&mut buf, "early");
        let (seen, read) = oneshot::channel();
        let reader = log.clone();
        let synced = log
            .append_early(buf, move |written| {
                let got = written.map(|(loc, _pin)| body(&reader.read(loc, len)));
                let _ = seen.send(got.ok().flatten());
            })
            .expect("append");
        assert_eq!(
            read.await.expect("written step ran"),
            Some(b"early".to_vec()),
            "the record reads back in the step before the sync"
        );
        synced.await.expect("told").expect("synced");

        log.close();
        let mut buf = BytesMut::new();
        enqueue(&mut buf, "late");
        let ran = Arc::new(AtomicU64::new(0));
        let counted = ran.clone();
        let refused = log.append_early(buf, move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        assert!(refused.is_err(), "a closed log refuses the append");
        assert_eq!(ran.load(Ordering::Relaxed), 0, "and runs nothing");
    }

    /// A log in `dir` whose fdatasyncs are made by `sync`.
    fn syncing_with(dir: &Path, sync: SyncFn) -> Log {
        Log::start_syncing_with(dir, &[], SEGMENT_BYTES, Box::new(BytesMut::new), sync)
            .expect("log")
    }

    /// A sync held until its test opens the gate.
    struct Gate {
        open: Mutex<bool>,
        turned: std::sync::Condvar,
    }

    impl Gate {
        const fn new() -> Gate {
            Gate {
                open: Mutex::new(false),
                turned: std::sync::Condvar::new(),
            }
        }

        fn pass(&self) {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            while !*open {
                open = self.turned.wait(open).unwrap_or_else(|e| e.into_inner());
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.turned.notify_all();
        }
    }

    static HELD: Gate = Gate::new();

    fn held_sync(f: &File) -> io::Result<()> {
        HELD.pass();
        f.sync_data()
    }

    /// What an early append's written step saw.
    struct Seen {
        written: Written,
        thread: std::thread::ThreadId,
    }

    /// Starts an early append of `body`; returns its sync's receiver and where its written step
    /// reports.
    fn early(
        log: &Log,
        body: &str,
    ) -> (
        oneshot::Receiver<io::Result<()>>,
        std::sync::mpsc::Receiver<Seen>,
    ) {
        let mut buf = BytesMut::new();
        enqueue(&mut buf, body);
        let (seen, written) = std::sync::mpsc::channel();
        let synced = log
            .append_early(buf, move |w| {
                let _ = seen.send(Seen {
                    written: w,
                    thread: std::thread::current().id(),
                });
            })
            .expect("append");
        (synced, written)
    }

    /// A durable append that finds the writer thread idle is written on the sender's own thread
    /// (visible before `append_early` returns, without waking the writer) and only its
    /// fdatasync is handed over; one that finds the writer busy in a sync joins its next batch.
    /// Nothing is reported on disk before the disk says so.
    #[tokio::test]
    async fn an_idle_writer_lets_the_sender_write_and_a_busy_one_batches() {
        let dir = tempfile::tempdir().expect("dir");
        let log = syncing_with(dir.path(), held_sync);
        // Opens the gate however the test ends, or closing the log would wait for it for ever.
        struct OpenOnDrop;
        impl Drop for OpenOnDrop {
            fn drop(&mut self) {
                HELD.open();
            }
        }
        let _open = OpenOnDrop;
        // The writer thread waits for work once it has started.
        let ten_s = std::time::Duration::from_secs(10);
        testkit::eventually("the writer waits for work", ten_s, || {
            log.writer_idle.load(Ordering::Acquire)
        });
        let (mut a_synced, a_seen) = early(&log, "a");
        let a = a_seen
            .try_recv()
            .expect("written before append_early returned");
        assert_eq!(
            a.thread,
            std::thread::current().id(),
            "on the sender's thread"
        );
        a.written.expect("a written");
        // The writer thread takes a's sync and holds there.
        testkit::eventually("the writer takes the sync", ten_s, || {
            !log.writer_idle.load(Ordering::Acquire)
        });
        let (b_synced, b_seen) = early(&log, "b");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            b_seen.try_recv().is_err(),
            "b waits for the writer's next batch"
        );
        assert!(
            matches!(
                a_synced.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "a is not reported on disk while its fdatasync is held"
        );
        HELD.open();
        a_synced.await.expect("told").expect("a synced");
        let b = b_seen
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("b written");
        assert_ne!(
            b.thread,
            std::thread::current().id(),
            "by the writer thread"
        );
        b.written.expect("b written");
        b_synced.await.expect("told").expect("b synced");
    }

    /// The inode of the first file [`failing_disk`] was asked to sync.
    static BAD_INODE: AtomicU64 = AtomicU64::new(0);

    /// A disk on which the first file synced can never be synced again (every later fdatasync
    /// of it fails too); other files sync.
    fn failing_disk(f: &File) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let inode = f.metadata()?.ino();
        let bad = match BAD_INODE.compare_exchange(0, inode, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => inode,
            Err(bad) => bad,
        };
        if inode == bad {
            return Err(io::Error::other("injected: this file's blocks are gone"));
        }
        f.sync_data()
    }

    /// A failed fdatasync fails the appends of its batch, and the log goes on in a new segment
    /// without syncing the failed one again (which proves nothing, and here fails for good),
    /// whose appends are stored and read back.
    #[tokio::test]
    async fn a_failed_sync_fails_its_batch_and_the_log_goes_on_in_a_new_segment() {
        let dir = tempfile::tempdir().expect("dir");
        let log = syncing_with(dir.path(), failing_disk);
        let first = log.active_segment();
        let mut buf = BytesMut::new();
        enqueue(&mut buf, "lost");
        assert!(log.append(buf).await.is_err(), "its sync failed");
        let mut buf = BytesMut::new();
        let len = enqueue(&mut buf, "kept");
        let (at, _) = log.append(buf).await.expect("stored");
        assert!(at.segment > first, "in a new segment");
        assert_eq!(body(&log.read(at, len)), Some(b"kept".to_vec()));
    }

    /// Back-to-back records come back from one read each with their own body; a span that does
    /// not hold exactly one record fails alone; order is kept across appends.
    #[tokio::test]
    async fn read_many_reads_runs_and_checks_each_record() {
        let dir = tempfile::tempdir().expect("dir");
        let log = Log::start(dir.path(), &[], SEGMENT_BYTES, Box::new(BytesMut::new)).expect("log");
        let mut buf = BytesMut::new();
        let lens: Vec<u32> = ["a", "bb", "ccc"]
            .iter()
            .map(|b| enqueue(&mut buf, b))
            .collect();
        let (first, _) = log.append(buf).await.expect("append");
        let mut buf = BytesMut::new();
        let d_len = enqueue(&mut buf, "dddd");
        let (d, _) = log.append(buf).await.expect("append");

        let mut spans = Vec::new();
        let mut offset = first.offset;
        for len in &lens {
            spans.push((
                Location {
                    segment: first.segment,
                    offset,
                },
                *len,
            ));
            offset += u64::from(*len);
        }
        spans.push((d, d_len));
        // The second record again, claimed one byte longer than it is.
        spans.push((spans[1].0, lens[1] + 1));
        spans.push((spans[0].0, lens[0]));
        let got: Vec<Option<Vec<u8>>> = log.read_many(&spans).iter().map(body).collect();
        assert_eq!(
            got,
            [
                Some(b"a".to_vec()),
                Some(b"bb".to_vec()),
                Some(b"ccc".to_vec()),
                Some(b"dddd".to_vec()),
                None,
                Some(b"a".to_vec()),
            ]
        );
        assert_eq!(body(&log.read(d, d_len)), Some(b"dddd".to_vec()));
        let gone = Location {
            segment: 99,
            offset: 0,
        };
        assert!(log.read(gone, d_len).is_err());
    }
}
