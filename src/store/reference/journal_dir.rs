//! The reference's journal message store, the directory `messages/` (simplexmq
//! `src/Simplex/Messaging/Server/MsgStore/Journal.hs`). A queue's files are in a directory derived
//! from its recipient ID: base64url(rId) cut into four 2-character segments and the rest
//! (`msgQueueDirectory`, `pathParts` = 5), e.g. `messages/ab/cd/ef/gh/<rest>/`, holding
//!
//! - `queue_state.<base64url rId>.log`: one state line per change, the last one current:
//!   `write=<jid>,<msgPos>,<msgCount>,<bytePos>,<byteCount> read=<same> canWrite=<T|F> size=<n>`;
//! - `messages.<jid>.log`: message lines, as in the message log (`store/reference/msg_log.rs`).
//!
//! A queue's messages are the read journal from the read position to its end, then, when the write
//! journal is another file, that file up to its write position (`getJournalQueueMessages`).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::msg_log::parse_message;
use super::text::{boolean, int, shorten, Fields, MAX_LINE_BYTES};
use super::{Problem, Problems};
use crate::crypto::hash::b64url;
use crate::store::Message;

/// The reference's journal store directory, in its log directory.
pub const JOURNAL_DIR: &str = "messages";

/// The most a queue's two journal files may hold together here: the reference keeps at most 256
/// lines per file and its quota is 128 messages, each line at most about 22 KB.
const MAX_QUEUE_JOURNAL_BYTES: u64 = 2 * 256 * MAX_LINE_BYTES as u64;

/// One journal file's position in a queue's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalState {
    pub journal_id: String,
    pub msg_pos: i64,
    pub msg_count: i64,
    pub byte_pos: i64,
    pub byte_count: i64,
}

/// A queue's state line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    pub write: JournalState,
    pub read: JournalState,
    pub can_write: bool,
    pub size: i64,
}

/// The directory of the queue `rid` under `root` (`messages/`).
pub fn queue_dir(root: &Path, rid: &[u8]) -> PathBuf {
    let enc = b64url(rid);
    let mut dir = root.to_path_buf();
    let mut rest = enc.as_str();
    for _ in 0..4 {
        if rest.is_empty() {
            break;
        }
        let (seg, after) = rest.split_at(rest.len().min(2));
        dir.push(seg);
        rest = after;
    }
    if !rest.is_empty() {
        dir.push(rest);
    }
    dir
}

/// The state file of the queue `rid` in its directory.
pub fn state_path(dir: &Path, rid: &[u8]) -> PathBuf {
    dir.join(format!("queue_state.{}.log", b64url(rid)))
}

/// Parses a state line.
pub fn parse_state(line: &str) -> Result<QueueState, String> {
    let mut f = Fields::new(line);
    let write = journal_state(f.named("write=")?)?;
    let read = journal_state(f.named("read=")?)?;
    let can_write = boolean(f.named("canWrite=")?, "canWrite")?;
    let size = int(f.named("size=")?, "size")?;
    f.end()?;
    Ok(QueueState {
        write,
        read,
        can_write,
        size,
    })
}

fn journal_state(s: &str) -> Result<JournalState, String> {
    let mut parts = s.split(',');
    let journal_id = parts.next().unwrap_or_default().to_string();
    // The ID names a file in the queue's directory; the reference makes it base64url.
    if journal_id.is_empty()
        || !journal_id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'=')
    {
        return Err(format!("bad journal ID {:?}", shorten(&journal_id)));
    }
    let mut n = [0i64; 4];
    for v in &mut n {
        let p = parts.next().ok_or("a journal state has 5 parts")?;
        *v = p
            .parse()
            .ok()
            .filter(|v| *v >= 0)
            .ok_or_else(|| format!("a journal position is not a number: {:?}", shorten(p)))?;
    }
    if parts.next().is_some() {
        return Err("a journal state has 5 parts".into());
    }
    Ok(JournalState {
        journal_id,
        msg_pos: n[0],
        msg_count: n[1],
        byte_pos: n[2],
        byte_count: n[3],
    })
}

impl QueueState {
    /// The reference's `validQueueState`.
    pub fn is_valid(&self) -> bool {
        let (r, w) = (&self.read, &self.write);
        let always = r.msg_pos <= r.msg_count
            && r.byte_pos <= r.byte_count
            && w.msg_pos == w.msg_count
            && w.byte_pos == w.byte_count;
        if r.journal_id == w.journal_id {
            always
                && r.msg_pos <= w.msg_pos
                && r.msg_count == w.msg_count
                && r.byte_pos <= w.byte_pos
                && r.byte_count == w.byte_count
                && self.size == r.msg_count - r.msg_pos
        } else {
            always && self.size == w.msg_count + r.msg_count - r.msg_pos
        }
    }
}

/// The current state of a queue from its state file's lines (`readQueueState`): the last line,
/// or the one before it when the last does not parse (a crash while appending); `None` for an
/// empty file or a single bad line (the reference starts the queue afresh: no messages).
pub fn current_state(text: &str, path: &Path) -> Result<Option<QueueState>, String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    let Some(last) = lines.last() else {
        return Ok(None);
    };
    let st = match parse_state(last) {
        Ok(st) => st,
        Err(_) if lines.len() == 1 => return Ok(None),
        Err(_) => parse_state(lines[lines.len() - 2]).map_err(|e| {
            format!(
                "{}: neither of its last two lines is a queue state ({e}); the reference \
                 refuses it too",
                path.display()
            )
        })?,
    };
    if !st.is_valid() {
        return Err(format!(
            "{}: the queue state is inconsistent ({}); the reference refuses it too",
            path.display(),
            shorten(last)
        ));
    }
    Ok(Some(st))
}

/// The messages of the queue `rid`, oldest first; unparseable lines and missing or short journal
/// files go to `problems` (their messages are lost, as the reference loses them). An
/// inconsistent state is an error: the reference does not start on it either.
pub fn read_queue(
    root: &Path,
    rid: &[u8],
    problems: &mut Problems,
) -> Result<Vec<Message>, String> {
    let dir = queue_dir(root, rid);
    let path = state_path(&dir, rid);
    // A crash while the reference compacted the state file leaves its previous version as `.bak`,
    // which the reference renames back at its next start; it is read in its place here (the
    // reference's files are left as they are).
    let bak = PathBuf::from(format!("{}.bak", path.display()));
    let path = if bak.exists() { bak } else { path };
    let text = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let text = String::from_utf8_lossy(&text);
    let Some(st) = current_state(&text, &path)? else {
        return Ok(Vec::new());
    };
    if st.size == 0 {
        return Ok(Vec::new());
    }
    let mut msgs = Vec::new();
    read_range(
        &dir,
        &st.read,
        st.read.byte_pos,
        st.read.byte_count,
        &mut msgs,
        problems,
    )?;
    if st.write.journal_id != st.read.journal_id {
        read_range(&dir, &st.write, 0, st.write.byte_pos, &mut msgs, problems)?;
    }
    Ok(msgs)
}

fn read_range(
    dir: &Path,
    j: &JournalState,
    from: i64,
    to: i64,
    msgs: &mut Vec<Message>,
    problems: &mut Problems,
) -> Result<(), String> {
    if to <= from {
        return Ok(());
    }
    let path = dir.join(format!("messages.{}.log", j.journal_id));
    let len = (to - from) as u64;
    if len > MAX_QUEUE_JOURNAL_BYTES {
        return Err(format!(
            "{}: its state claims {len} bytes of messages, more than a queue can hold",
            path.display()
        ));
    }
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            problems.push(Problem::new(
                &path,
                0,
                format!("cannot read it ({e}); its messages are lost"),
            ));
            return Ok(());
        }
    };
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(from as u64))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    file.take(len)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if (buf.len() as u64) < len {
        problems.push(Problem::new(
            &path,
            0,
            format!(
                "the file ends {} bytes before the position its queue state records",
                len - buf.len() as u64
            ),
        ));
    }
    // Line numbers count from the read position, the first line read being line 1.
    for (i, line) in buf.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed = std::str::from_utf8(line)
            .map_err(|_| "not UTF-8 text".to_string())
            .and_then(|l| parse_message(&mut Fields::new(l)));
        match parsed {
            Ok(m) => msgs.push(m),
            Err(e) => problems.push(Problem::new(&path, i + 1, e)),
        }
    }
    Ok(())
}

/// The recipient IDs of every queue directory under `root` that holds a state file.
pub fn queues_in(root: &Path) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    walk(root, 0, &mut out)?;
    Ok(out)
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<Vec<u8>>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = entry.path();
        // Four segment directories, then the queue's own: nothing deeper is the reference's.
        if path.is_dir() && depth < 5 {
            walk(&path, depth + 1, out)?;
        } else if let Some(rid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("queue_state."))
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(crate::crypto::hash::b64url_decode)
        {
            out.push(rid);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_directory_is_its_id_cut_into_segments() {
        let rid = [7u8; 24]; // "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcH"
        assert_eq!(
            queue_dir(Path::new("m"), &rid),
            PathBuf::from("m/Bw/cH/Bw/cH/BwcHBwcHBwcHBwcHBwcHBwcH")
        );
        assert_eq!(
            state_path(Path::new("d"), &rid),
            PathBuf::from("d/queue_state.BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcH.log")
        );
    }

    #[test]
    fn state_lines_parse_and_are_checked() {
        let st = parse_state(
            "write=AAAAAAAAAAAAAAAA,3,3,300,300 read=AAAAAAAAAAAAAAAA,1,3,100,300 canWrite=T size=2",
        )
        .unwrap();
        assert_eq!(st.read.byte_pos, 100);
        assert!(st.can_write);
        assert!(st.is_valid());
        let two = parse_state(
            "write=BBBBBBBBBBBBBBBB,2,2,90,90 read=AAAAAAAAAAAAAAAA,255,256,9000,9100 canWrite=F size=3",
        )
        .unwrap();
        assert!(two.is_valid());
        let wrong = QueueState {
            size: 5,
            ..st.clone()
        };
        assert!(!wrong.is_valid());
        assert!(
            parse_state("write=../x,0,0,0,0 read=a,0,0,0,0 canWrite=T size=0")
                .unwrap_err()
                .contains("bad journal ID")
        );
    }

    #[test]
    fn the_last_good_line_is_the_state() {
        let good = "write=AAAA,1,1,10,10 read=AAAA,0,1,0,10 canWrite=T size=1";
        let p = Path::new("s");
        let text = format!("{good}\nwrite=AAAA,2,2");
        assert_eq!(current_state(&text, p).unwrap().unwrap().size, 1);
        assert_eq!(current_state("write=", p).unwrap(), None);
        assert!(current_state("bad\nworse", p)
            .unwrap_err()
            .contains("neither"));
    }
}
