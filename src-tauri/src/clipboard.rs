//! The clipboard's image for the composer, read with GTK's clipboard: WebKitGTK's paste event carries none (E14).
//!
//! When the clipboard holds only a picture (a screenshot tool's `image/png`), WebKitGTK 2.50
//! fires `paste` with an empty `clipboardData` (no types, no items, no files), so the page
//! cannot see it; its async `navigator.clipboard.read()` finds PNG only, never JPEG. The UI
//! asks here instead (`clipboard_image`) when a paste brought neither an image nor text.

use std::time::Duration;

use bumblehive::protocol::ImagePart;

/// How an image offered on the clipboard is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Its bytes as they are: a type every provider accepts (no re-encoding, no loss).
    AsIs(&'static str),
    /// Another image type GTK can load (BMP, TIFF, …): converted to PNG.
    ToPng,
}

/// Which of the clipboard's targets to read: a sendable type first (PNG before the others,
/// as screenshots are), else any other image type, else none (text, files, nothing).
pub fn choose(targets: &[String]) -> Option<Take> {
    const PREFERRED: [&str; 4] = ["image/png", "image/jpeg", "image/webp", "image/gif"];
    debug_assert!(PREFERRED.iter().all(|t| ImagePart::MEDIA_TYPES.contains(t)));
    if let Some(found) = PREFERRED
        .iter()
        .find(|wanted| targets.iter().any(|t| t.eq_ignore_ascii_case(wanted)))
    {
        return Some(Take::AsIs(found));
    }
    targets
        .iter()
        .any(|t| t.to_ascii_lowercase().starts_with("image/"))
        .then_some(Take::ToPng)
}

/// The image as the UI attaches it; refused when larger than the runtime accepts, so a
/// huge picture is not shipped to the page only to be refused there.
pub fn image_part(media_type: &str, bytes: &[u8]) -> Result<ImagePart, String> {
    if bytes.is_empty() {
        return Err("the clipboard's image could not be read (its owner sent nothing)".into());
    }
    if bytes.len() > ImagePart::MAX_BYTES {
        return Err(format!(
            "the clipboard's image is {:.1} MiB; an image may be at most {} MiB",
            bytes.len() as f64 / (1024.0 * 1024.0),
            ImagePart::MAX_BYTES / (1024 * 1024)
        ));
    }
    Ok(ImagePart {
        media_type: media_type.to_string(),
        data: base64(bytes),
    })
}

/// Standard base64 with padding, as `ImagePart::data` is (no crate of its own for this).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A clipboard owner that never answers would leave the paste waiting for ever; GTK gives
/// up on its own after a while, this is the bound on our side.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The clipboard's image, or `None` when it holds none. GTK's clipboard lives on the main
/// thread: the read is started there and answers through a channel.
pub async fn read(app: &tauri::AppHandle) -> Result<Option<ImagePart>, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    app.run_on_main_thread(move || platform::read(Box::new(move |answer| drop(tx.send(answer)))))
        .map_err(|err| format!("cannot reach the window's main thread: {err}"))?;
    match tokio::time::timeout(READ_TIMEOUT, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err("the clipboard read was dropped".into()),
        Err(_) => Err(format!(
            "the clipboard's owner did not answer within {} s",
            READ_TIMEOUT.as_secs()
        )),
    }
}

type Answer = Box<dyn FnOnce(Result<Option<ImagePart>, String>)>;

#[cfg(target_os = "linux")]
mod platform {
    use super::{Answer, Take, choose, image_part};
    use gtk::gdk;

    /// Asks for the clipboard's targets, then for the chosen one's bytes (or its pixbuf).
    /// Callbacks, not GTK's `wait_for_*`: those spin a nested main loop inside the window's.
    pub fn read(answer: Answer) {
        let clipboard = gtk::Clipboard::get(&gdk::SELECTION_CLIPBOARD);
        clipboard.request_contents(&gdk::Atom::intern("TARGETS"), move |clipboard, data| {
            let targets: Vec<String> = data
                .targets()
                .unwrap_or_default()
                .into_iter()
                .map(|atom| atom.name().to_string())
                .collect();
            match choose(&targets) {
                None => answer(Ok(None)),
                Some(Take::AsIs(media_type)) => clipboard
                    .request_contents(&gdk::Atom::intern(media_type), move |_, data| {
                        answer(image_part(media_type, &data.data()).map(Some))
                    }),
                Some(Take::ToPng) => clipboard.request_image(move |_, pixbuf| {
                    let Some(pixbuf) = pixbuf else {
                        return answer(Err("the clipboard's image could not be loaded".into()));
                    };
                    answer(
                        pixbuf
                            .save_to_bufferv("png", &[])
                            .map_err(|err| format!("cannot convert the clipboard's image: {err}"))
                            .and_then(|png| image_part("image/png", &png))
                            .map(Some),
                    )
                }),
            }
        });
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use super::Answer;

    /// Other systems' webviews hand pasted images to the page themselves.
    pub fn read(answer: Answer) {
        answer(Ok(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_sendable_type_is_taken_as_is_png_first() {
        assert_eq!(
            choose(&names(&["TARGETS", "image/png"])),
            Some(Take::AsIs("image/png"))
        );
        assert_eq!(
            choose(&names(&["image/jpeg"])),
            Some(Take::AsIs("image/jpeg"))
        );
        // An image viewer offers every type GdkPixbuf writes: the PNG is the lossless one.
        assert_eq!(
            choose(&names(&[
                "image/bmp",
                "image/jpeg",
                "image/png",
                "image/tiff"
            ])),
            Some(Take::AsIs("image/png"))
        );
    }

    #[test]
    fn other_image_types_are_converted_and_text_is_left_alone() {
        assert_eq!(choose(&names(&["image/bmp", "TARGETS"])), Some(Take::ToPng));
        assert_eq!(
            choose(&names(&["UTF8_STRING", "text/plain", "TARGETS"])),
            None
        );
        assert_eq!(choose(&[]), None);
    }

    #[test]
    fn image_parts_are_base64_and_bounded() {
        let part = image_part("image/png", b"hello!!").unwrap();
        assert_eq!(part.media_type, "image/png");
        assert_eq!(part.data, "aGVsbG8hIQ==");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert!(image_part("image/png", b"").is_err());
        let big = vec![0u8; ImagePart::MAX_BYTES + 1];
        assert!(
            image_part("image/png", &big)
                .unwrap_err()
                .contains("at most 5 MiB")
        );
    }
}
