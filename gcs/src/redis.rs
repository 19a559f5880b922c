//! The head's durable state in Redis, for heads whose own disk is not kept
//! (a pod): the same tables as the state file, as four Redis hashes under
//! a namespace (`<namespace>:meta`, `:kv`, `:names`, `:nodes`), written
//! with one command per change (each atomic in Redis).
//!
//! The client speaks RESP2, Redis's wire protocol, over one blocking TCP
//! connection (the changes are small and already serialised by the
//! control store's locks), opened again once after a broken one. How long
//! a written change survives is Redis's to say: with `appendonly yes` and
//! `appendfsync always` as much as the state file's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long connecting, and each reply, may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The longest bulk reply read (a key-value entry is bounded far lower).
const MAX_BULK: usize = 512 << 20;

/// Where the state is kept in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisPlace {
    /// `HOST:PORT`.
    pub address: String,
    /// Redis's `requirepass`, if it has one.
    pub password: Option<String>,
    /// The prefix of the hashes: one cluster's state per namespace.
    pub namespace: String,
}

impl std::fmt::Display for RedisPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Redis at {}, namespace {:?}",
            self.address, self.namespace
        )
    }
}

/// A field of a hash and its value.
pub(crate) type Field = (Vec<u8>, Vec<u8>);

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A connection to Redis, opened on demand.
#[derive(Debug)]
pub(crate) struct Redis {
    place: RedisPlace,
    conn: parking_lot::Mutex<Option<BufReader<TcpStream>>>,
}

impl Redis {
    /// Connects (and authenticates) now, so that a wrong address or
    /// password is told at start.
    pub(crate) fn connect(place: RedisPlace) -> Result<Redis, String> {
        let redis = Redis {
            place,
            conn: parking_lot::Mutex::new(None),
        };
        redis.command(&[b"PING"])?;
        Ok(redis)
    }

    /// The name of one of the state's hashes.
    pub(crate) fn hash(&self, table: &str) -> Vec<u8> {
        format!("{}:{table}", self.place.namespace).into_bytes()
    }

    /// Runs one command, again on a new connection if the old one broke.
    pub(crate) fn command(&self, args: &[&[u8]]) -> Result<Reply, String> {
        let mut conn = self.conn.lock();
        for attempt in 0..2 {
            if conn.is_none() {
                *conn = Some(self.open()?);
            }
            let Some(stream) = conn.as_mut() else {
                continue;
            };
            match exchange(stream, args) {
                Ok(Ok(reply)) => return Ok(reply),
                // Redis answered with an error: the connection is fine.
                Ok(Err(message)) => return Err(format!("Redis answered: {message}")),
                Err(e) => {
                    *conn = None;
                    if attempt == 1 {
                        return Err(format!("the connection broke: {e}"));
                    }
                }
            }
        }
        Err("cannot connect".to_string())
    }

    /// Every field of a hash, with its value.
    pub(crate) fn hgetall(&self, table: &str) -> Result<Vec<Field>, String> {
        let hash = self.hash(table);
        match self.command(&[b"HGETALL", &hash])? {
            Reply::Array(items) => {
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(Reply::Bulk(Some(k))), Some(Reply::Bulk(Some(v)))) =
                    (it.next(), it.next())
                {
                    pairs.push((k, v));
                }
                Ok(pairs)
            }
            other => Err(format!("HGETALL answered {other:?}")),
        }
    }

    fn open(&self) -> Result<BufReader<TcpStream>, String> {
        let failed = |e: std::io::Error| format!("cannot connect: {e} (is Redis running there?)");
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&self.place.address)
            .map_err(failed)?
            .next()
            .ok_or_else(|| format!("{} names no address", self.place.address))?;
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(failed)?;
        stream.set_read_timeout(Some(TIMEOUT)).map_err(failed)?;
        stream.set_write_timeout(Some(TIMEOUT)).map_err(failed)?;
        let _ = stream.set_nodelay(true);
        let mut reader = BufReader::new(stream);
        if let Some(password) = &self.place.password {
            match exchange(&mut reader, &[b"AUTH", password.as_bytes()]) {
                Ok(Ok(_)) => {}
                Ok(Err(message)) => {
                    return Err(format!(
                        "Redis refused the password (PRISM_REDIS_PASSWORD): {message}"
                    ))
                }
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(reader)
    }
}

/// Sends a command and reads its reply: `Ok(Err(message))` for an error
/// reply, `Err` for a broken connection or a reply that is not RESP.
fn exchange(
    stream: &mut BufReader<TcpStream>,
    args: &[&[u8]],
) -> std::io::Result<Result<Reply, String>> {
    let mut out = Vec::with_capacity(64 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    stream.get_mut().write_all(&out)?;
    read_reply(stream)
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

fn read_line(stream: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = Vec::new();
    // Bounded: a line is a type byte and a number or a short status.
    stream.take(64 * 1024).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(bad("a reply line without its end".into()));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| bad("a reply line that is not text".into()))
}

fn read_reply(stream: &mut impl BufRead) -> std::io::Result<Result<Reply, String>> {
    let line = read_line(stream)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    let number = |s: &str| -> std::io::Result<i64> {
        s.parse().map_err(|_| bad(format!("{s:?} is not a number")))
    };
    Ok(Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => return Ok(Err(rest.to_string())),
        ":" => Reply::Int(number(rest)?),
        "$" => {
            let len = number(rest)?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let len = len as usize;
                if len > MAX_BULK {
                    return Err(bad(format!("a reply of {len} bytes")));
                }
                let mut data = vec![0u8; len + 2];
                stream.read_exact(&mut data)?;
                data.truncate(len);
                Reply::Bulk(Some(data))
            }
        }
        "*" => {
            let len = number(rest)?;
            if len < 0 {
                Reply::Array(Vec::new())
            } else {
                let mut items = Vec::new();
                for _ in 0..len {
                    match read_reply(stream)? {
                        Ok(item) => items.push(item),
                        Err(message) => return Ok(Err(message)),
                    }
                }
                Reply::Array(items)
            }
        }
        other => return Err(bad(format!("a reply of unknown type {other:?}"))),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> std::io::Result<Result<Reply, String>> {
        read_reply(&mut std::io::Cursor::new(bytes.to_vec()))
    }

    #[test]
    fn replies_of_every_kind_are_read() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Ok(Reply::Simple("OK".into())));
        assert_eq!(parse(b":12\r\n").unwrap(), Ok(Reply::Int(12)));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Ok(Reply::Bulk(None)));
        assert_eq!(
            parse(b"$5\r\na\r\nbc\r\n").unwrap(),
            Ok(Reply::Bulk(Some(b"a\r\nbc".to_vec())))
        );
        assert_eq!(
            parse(b"*2\r\n$1\r\nk\r\n$0\r\n\r\n").unwrap(),
            Ok(Reply::Array(vec![
                Reply::Bulk(Some(b"k".to_vec())),
                Reply::Bulk(Some(Vec::new()))
            ]))
        );
        assert_eq!(
            parse(b"-WRONGPASS invalid\r\n").unwrap(),
            Err("WRONGPASS invalid".to_string())
        );
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$5\r\nab").is_err(), "a cut-off reply");
        assert!(parse(b"$99999999999\r\n").is_err(), "an absurd length");
    }
}
