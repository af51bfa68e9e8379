//! Coalescing a live event feed into per-frame batches for a window (the desktop shell's IPC).
//!
//! A window paints about every 16 ms; a message per content delta across the IPC costs
//! more than the delta itself once several runs stream at once. [`frames`] turns a feed
//! into a feed of batches: at most one batch per frame, every event in its original order,
//! and a lone event after a quiet spell goes out at once (leading edge), so coalescing
//! never delays an event by more than one frame.

use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

/// One frame of a 60 Hz display: the longest an event waits for its batch.
pub const FRAME: Duration = Duration::from_millis(16);

struct State<S: Stream> {
    feed: S,
    frame: Duration,
    /// When the last batch went out (None: never, so the first event goes at once).
    last: Option<Instant>,
    pending: Vec<S::Item>,
    ended: bool,
}

/// Batches `feed` per `frame`: the first event after a quiet frame is its own batch at
/// once; events arriving within a frame of the last batch are held until that frame ends
/// and go out together. Order is kept; the stream ends after the feed ends and the last
/// held events went out.
pub fn frames<S>(feed: S, frame: Duration) -> impl Stream<Item = Vec<S::Item>>
where
    S: Stream + Unpin,
{
    let state = State {
        feed,
        frame,
        last: None,
        pending: Vec::new(),
        ended: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.ended {
                if s.pending.is_empty() {
                    return None;
                }
                let batch = std::mem::take(&mut s.pending);
                return Some((batch, s));
            }
            if s.pending.is_empty() {
                match s.feed.next().await {
                    None => s.ended = true,
                    Some(event) => {
                        let now = Instant::now();
                        let quiet = s
                            .last
                            .is_none_or(|last| now.duration_since(last) >= s.frame);
                        if quiet {
                            s.last = Some(now);
                            return Some((vec![event], s));
                        }
                        s.pending.push(event);
                    }
                }
                continue;
            }
            // Events are held: take what arrives until the frame that the last batch
            // opened is over (`biased`: what is already there joins this batch).
            let deadline = s.last.map_or_else(Instant::now, |last| last + s.frame);
            tokio::select! {
                biased;
                next = s.feed.next() => match next {
                    Some(event) => s.pending.push(event),
                    None => s.ended = true,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    s.last = Some(Instant::now());
                    let batch = std::mem::take(&mut s.pending);
                    return Some((batch, s));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    const WAIT: Duration = Duration::from_secs(5);

    async fn next_batch<S: Stream<Item = Vec<u32>> + Unpin>(batches: &mut S) -> Option<Vec<u32>> {
        tokio::time::timeout(WAIT, batches.next())
            .await
            .unwrap_or_else(|_| panic!("no batch within {WAIT:?}"))
    }

    #[tokio::test]
    async fn frames_a_lone_event_goes_out_at_once_and_a_burst_is_one_batch_in_order() {
        let (tx, rx) = mpsc::unbounded_channel();
        // A frame far longer than the test: a held event could only come out by the
        // deadline, so the lone event arriving first proves the leading edge.
        let mut batches = Box::pin(frames(
            UnboundedReceiverStream::new(rx),
            Duration::from_secs(3),
        ));
        tx.send(1).unwrap_or_default();
        assert_eq!(next_batch(&mut batches).await, Some(vec![1]));
        for n in 2..=6 {
            tx.send(n).unwrap_or_default();
        }
        // Within the frame of the first batch: held, then one batch, in order.
        assert_eq!(next_batch(&mut batches).await, Some(vec![2, 3, 4, 5, 6]));
        drop(tx);
        assert_eq!(next_batch(&mut batches).await, None);
    }

    #[tokio::test]
    async fn frames_held_events_are_flushed_when_the_feed_ends() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut batches = Box::pin(frames(
            UnboundedReceiverStream::new(rx),
            Duration::from_secs(60),
        ));
        for n in 1..=4 {
            tx.send(n).unwrap_or_default();
        }
        drop(tx);
        assert_eq!(next_batch(&mut batches).await, Some(vec![1]));
        // The feed ended long before the frame would: what was held goes out now.
        assert_eq!(next_batch(&mut batches).await, Some(vec![2, 3, 4]));
        assert_eq!(next_batch(&mut batches).await, None);
    }

    #[tokio::test]
    async fn frames_a_steady_feed_gives_at_most_one_batch_per_frame_and_loses_nothing() {
        let (tx, rx) = mpsc::unbounded_channel();
        let frame = Duration::from_millis(20);
        let mut batches = Box::pin(frames(UnboundedReceiverStream::new(rx), frame));
        let producer = tokio::spawn(async move {
            for n in 0..200u32 {
                tx.send(n).unwrap_or_default();
                if n % 10 == 9 {
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
        let mut seen = Vec::new();
        let mut starts = Vec::new();
        while let Some(batch) = next_batch(&mut batches).await {
            starts.push(Instant::now());
            seen.extend(batch);
        }
        producer.await.unwrap_or_default();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
        // Batches never come closer together than a frame (but the one the end of the
        // feed flushes at once).
        let held = &starts[..starts.len().saturating_sub(1)];
        for pair in held.windows(2) {
            assert!(
                pair[1].duration_since(pair[0]) + Duration::from_millis(2) >= frame,
                "{starts:?}"
            );
        }
    }
}
