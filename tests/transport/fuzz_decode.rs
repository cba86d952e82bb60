//! A seeded byte-mutation fuzzer for everything the relay decodes from a client before any
//! authorization: block (plain and encrypted), batch, transmission at every version, command, client
//! hello. It runs on the stable toolchain as an ordinary test; the property is "no panic, and a
//! well-formed input still decodes the same after a round trip". `FUZZ_ITERATIONS` and `FUZZ_SEED`
//! lengthen or replay a run.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use smp_relay::protocol::batch::{parse_batch, BatchWriter};
use smp_relay::protocol::command::parse_command;
use smp_relay::protocol::handshake::ClientHello;
use smp_relay::protocol::transmission::{encode_client_transmission, parse_transmission};
use smp_relay::transport::block::{BlockCodec, BLOCK_SIZE};

/// Well-formed seeds to mutate: commands at their wire form (parameters are what matters to the
/// parsers; keys are the reference tests' sample keys).
fn seed_commands() -> Vec<Vec<u8>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let ed = b64
        .decode("MCowBQYDK2VwAyEAfAOflyvbJv1fszgzkQ6buiZJVgSpQWsucXq7U6zjMgY=")
        .unwrap();
    let dh = b64
        .decode("MCowBQYDK2VuAyEAriy+HcARIhqsgSjVnjKqoft+y6pxrxdY68zn4+LjYhQ=")
        .unwrap();
    let short = |v: &[u8]| {
        let mut o = vec![v.len() as u8];
        o.extend_from_slice(v);
        o
    };
    let mut new = b"NEW ".to_vec();
    new.extend(short(&ed));
    new.extend(short(&dh));
    // v17+: no basic auth, subscribe, messaging queue without link data, no notifier credentials.
    new.extend_from_slice(b"0S1M00");
    let mut key = b"KEY ".to_vec();
    key.extend(short(&ed));
    let mut nkey = b"NKEY ".to_vec();
    nkey.extend(short(&ed));
    nkey.extend(short(&dh));
    let mut prxy = b"PRXY ".to_vec();
    prxy.extend_from_slice(b"\x01\x09localhost\x044444");
    prxy.extend(short(&[7u8; 32]));
    prxy.push(b'0');
    vec![
        new,
        key,
        nkey,
        prxy,
        b"SUB".to_vec(),
        b"SEND F hello".to_vec(),
        b"ACK \x181234567890abcdefghijklmn".to_vec(),
        b"PING".to_vec(),
        b"LSET \x03abc\x00\x02xy\x00\x01z".to_vec(),
        b"RKEY \x01".iter().copied().chain(short(&ed)).collect(),
        b"PFWD \x00\x12"
            .iter()
            .copied()
            .chain(short(&dh))
            .chain(*b"etc")
            .collect(),
        b"RSLV privacy.simplex".to_vec(),
    ]
}

fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        match rng.gen_range(0..5) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] = rng.gen();
            }
            1 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v.truncate(i);
            }
            2 => {
                let i = rng.gen_range(0..=v.len());
                v.insert(i, rng.gen());
            }
            3 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] = [0, 1, 0x7f, 0x80, 0xff, b' ', b'0', b'1', b'T'][rng.gen_range(0..9)];
            }
            _ => {
                let i = rng.gen_range(0..=v.len());
                let n = rng.gen_range(0..40);
                v.splice(i..i, (0..n).map(|_| rng.gen::<u8>()));
            }
        }
    }
    v
}

fn iterations() -> u64 {
    std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026)
}

#[test]
fn mutated_commands_and_transmissions_never_panic() {
    let seed = seed();
    eprintln!("FUZZ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let cmds = seed_commands();
    let session = [9u8; 32];
    let mut parsed_ok = 0u64;
    for _ in 0..iterations() {
        let cmd = &cmds[rng.gen_range(0..cmds.len())];
        let v: u16 = rng.gen_range(6..=20);
        let m = mutate(&mut rng, cmd);
        if parse_command(v, &m).is_ok() {
            parsed_ok += 1;
        }
        let auth: &[u8] = [&[][..], &[1u8; 64][..], &[2u8; 80][..]][rng.gen_range(0..3)];
        let t = encode_client_transmission(v, &session, auth, None, b"corr", b"entity", cmd);
        let mt = mutate(&mut rng, &t);
        if let Ok(raw) = parse_transmission(v, &mt) {
            let _ = parse_command(v, raw.command);
        }
    }
    // The mutations keep some inputs valid (e.g. a changed body byte of SEND): a parser that rejects
    // everything would not be tested by this run.
    assert!(parsed_ok > 0, "no mutated command parsed at all");
    // Unmutated seeds parse at the current version.
    for c in &cmds {
        assert!(
            parse_command(18, c).is_ok(),
            "seed does not parse: {:?}",
            String::from_utf8_lossy(c)
        );
    }
}

#[test]
fn mutated_blocks_and_batches_never_panic() {
    let seed = seed() ^ 1;
    eprintln!("FUZZ_SEED={}", seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut w = BatchWriter::new();
    let t = encode_client_transmission(18, &[0u8; 32], b"", None, b"c", b"", b"PING");
    for _ in 0..3 {
        assert!(w.try_push(&t));
    }
    let content = w.content();
    assert_eq!(parse_batch(&content).unwrap().len(), 3);
    let n = iterations() / 10;
    let secret = [3u8; 32];
    let sid = [4u8; 32];
    for _ in 0..n {
        let m = mutate(&mut rng, &content);
        let _ = parse_batch(&m);
        // A plain block with mutated padding/length, and an encrypted block with random bytes: both
        // must fail or decode, never panic, and an encrypted failure must leave the chains usable.
        let mut block = [b'#'; BLOCK_SIZE];
        let len = m.len().min(BLOCK_SIZE - 2);
        block[0..2].copy_from_slice(&(rng.gen::<u16>()).to_be_bytes());
        block[2..2 + len].copy_from_slice(&m[..len]);
        let mut plain = BlockCodec::plain();
        let _ = plain.decode(&mut block);
        let mut client = BlockCodec::client(&sid, &secret);
        let mut server = BlockCodec::server(&sid, &secret);
        // The client's first block is replaced in transit by random bytes: it fails, and the
        // chains stay in step for the blocks after it.
        let mut first = [0u8; BLOCK_SIZE];
        client.encode(b"lost", &mut first).unwrap();
        rng.fill(&mut first[..]);
        assert!(server.decode(&mut first).is_err());
        let mut good = [0u8; BLOCK_SIZE];
        client.encode(&m[..m.len().min(1000)], &mut good).unwrap();
        let mut again = [0u8; BLOCK_SIZE];
        client.encode(&content, &mut again).unwrap();
        assert_eq!(server.decode(&mut good).unwrap(), &m[..m.len().min(1000)]);
        assert_eq!(server.decode(&mut again).unwrap(), &content[..]);
    }
}

#[test]
fn mutated_client_hellos_never_panic() {
    let mut rng = StdRng::seed_from_u64(seed() ^ 2);
    let mut hello = vec![0x00, 0x12, 0x20];
    hello.extend_from_slice(&[5u8; 32]);
    hello.push(44);
    hello.extend_from_slice(&smp_relay::crypto::keys::x25519_to_spki(&[6u8; 32]));
    hello.extend_from_slice(b"F0");
    let parsed = ClientHello::decode(&hello).expect("a v18 hello decodes");
    assert_eq!(parsed.version, 18);
    assert_eq!(parsed.client_key, Some([6u8; 32]));
    for _ in 0..iterations() / 10 {
        let m = mutate(&mut rng, &hello);
        let _ = ClientHello::decode(&m);
    }
}
