//! A plugin that misbehaves on request, to prove the host survives its guests.
//!
//! `decode` reads the payload as a command: `panic`, `loop`, `alloc` (1 GiB),
//! `big` (a 100 MB event), `big9` (a 9 MiB event: over the output cap, within memory), or anything else, which decodes to an event keyed
//! by the payload text. `render` and `classify` obey the event body the same way.

wit_bindgen::generate!({ path: "../../wit", world: "router" });

use exports::inlet::plugin::handler::{DecodeError, Decoded, Disposition, Event, Exchange, Message, Outcome, Request};


struct Plugin;

fn misbehave(command: &[u8]) {
    match command {
        b"panic" => panic!("hostile plugin panics as asked"),
        b"loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        b"alloc" => {
            let v = std::hint::black_box(vec![1u8; 1 << 30]);
            std::hint::black_box(&v);
        }
        _ => {}
    }
}

impl exports::inlet::plugin::handler::Guest for Plugin {
    fn decode(msg: Message) -> Result<Decoded, DecodeError> {
        misbehave(&msg.data);
        let text = String::from_utf8_lossy(&msg.data).into_owned();
        let body = match msg.data.as_slice() {
            b"big" => vec![b'x'; 100 << 20],
            b"big9" => vec![b'x'; 9 << 20],
            _ => msg.data.clone(),
        };
        Ok(Decoded::Event(Event {
            event_type: "hostile".into(),
            correlation_key: text.split(':').next().unwrap_or_default().to_string(),
            dedup_key: None,
            body,
            schema_version: None,
        }))
    }

    fn render(ev: Event) -> Result<Request, String> {
        misbehave(&ev.body);
        Ok(Request { method: "POST".into(), path: "/hostile".into(), headers: vec![], body: ev.body })
    }

    fn classify(_ev: Event, _exchange: Exchange, outcome: Outcome) -> Disposition {
        match outcome {
            Outcome::Response(r) if r.status < 300 => Disposition::Done,
            _ => Disposition::Retry(None),
        }
    }
}

export!(Plugin);
