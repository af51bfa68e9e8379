//! What the desktop shell turns off to keep its idle memory low: WebKitGTK features this UI
//! never uses, WebKit's caches sized for a document viewer, memory-pressure limits for the
//! network process, and glibc's per-thread malloc arenas in the shell (BENCHMARKS.md has the
//! figures before and after).
//!
//! Everything left on is something the UI uses: JavaScript, local storage (the UI's flags),
//! images from `data:`/`blob:` URLs (pasted and dropped images), the clipboard for copy
//! buttons. Links open in the system browser through the shell, not in a WebKit window.

/// The shell's malloc arenas. glibc makes up to 8 per core for threads that allocate at
/// once; each keeps its freed memory. The shell's threads (GTK's main loop, a few tokio
/// workers, WebKit's IPC) allocate little, so two arenas cost no contention worth seeing
/// and keep fewer half-empty heaps around. A value the person set wins.
pub fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's allocator parameters; called first in `main`,
    // before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// WebKit's network process (which here only serves local storage: the UI's assets come
/// from the shell's own protocol handler) gets a memory limit: above a third of it WebKit
/// drops its caches, above half it does so urgently. No kill threshold: it is never killed
/// for memory. Must run before the first web context exists (before the window is built).
pub fn limit_network_process() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain C calls on a settings struct this function owns and frees; WebKit
    // copies the settings. No GTK object is touched, so GTK need not be initialised yet.
    unsafe {
        use webkit2gtk::ffi;
        let settings = ffi::webkit_memory_pressure_settings_new();
        ffi::webkit_memory_pressure_settings_set_memory_limit(settings, NETWORK_LIMIT_MB);
        ffi::webkit_memory_pressure_settings_set_conservative_threshold(settings, 0.33);
        ffi::webkit_memory_pressure_settings_set_strict_threshold(settings, 0.5);
        ffi::webkit_website_data_manager_set_memory_pressure_settings(settings);
        ffi::webkit_memory_pressure_settings_free(settings);
    }
}

/// The network process's limit (MB): it idles at about 30 MB PSS, most of it libraries.
#[cfg(target_os = "linux")]
const NETWORK_LIMIT_MB: u32 = 96;

/// Turns off in the window's WebKit view what the UI does not use, and sizes WebKit's
/// caches for a single local document (no page cache: there is no back/forward navigation;
/// a small memory cache: every resource comes from the shell). Runs on the main thread.
pub fn slim_webview(window: &tauri::WebviewWindow) {
    #[cfg(target_os = "linux")]
    if let Err(err) = window.with_webview(|webview| {
        use webkit2gtk::{CacheModel, SettingsExt, WebContextExt, WebViewExt};
        let view = webview.inner();
        if let Some(context) = view.context() {
            context.set_cache_model(CacheModel::DocumentViewer);
        }
        let Some(settings) = WebViewExt::settings(&view) else {
            return;
        };
        // On by default (wry turns WebGL and WebAudio on); the UI draws with CSS and
        // plays no sound, video or camera.
        settings.set_enable_webgl(false);
        settings.set_enable_webaudio(false);
        settings.set_enable_media(false);
        settings.set_enable_media_stream(false);
        settings.set_enable_mediasource(false);
        settings.set_enable_encrypted_media(false);
        settings.set_enable_media_capabilities(false);
        settings.set_enable_webrtc(false);
        // No back/forward navigation in a one-page app: nothing to keep for it.
        settings.set_enable_page_cache(false);
        settings.set_enable_back_forward_navigation_gestures(false);
        // Browser conveniences that only cost memory or requests here.
        settings.set_enable_dns_prefetching(false);
        settings.set_enable_site_specific_quirks(false);
        settings.set_enable_spatial_navigation(false);
        settings.set_enable_html5_database(false);
        settings.set_enable_offline_web_application_cache(false);
        settings.set_enable_fullscreen(false);
        settings.set_javascript_can_open_windows_automatically(false);
    }) {
        tracing::warn!("cannot tune the web view: {err}");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = window;
}

/// WebKitGTK's accelerated compositing costs about 90 MB of memory (measured: 480 → 390 MB
/// RSS for all processes, BENCHMARKS.md) and this UI draws nothing that needs it. Someone
/// who wants it back sets the variable to 0 themselves. Called first in `main`, before any
/// other thread exists (also by the floor app of `scripts/bench-desktop.sh --floor`).
pub fn prefer_low_memory_rendering() {
    if std::env::var_os("WEBKIT_DISABLE_COMPOSITING_MODE").is_none() {
        // SAFETY: called first in `main`, before any other thread exists.
        unsafe { std::env::set_var("WEBKIT_DISABLE_COMPOSITING_MODE", "1") };
        keep_gl_out_of_the_shell();
    }
}

/// Keeps Mesa (and the LLVM it links, 26 MiB per process) out of the shell. With
/// compositing off the shell draws nothing with OpenGL, but two things still open it:
/// GTK probes GLX when it opens the display (told not to with `GDK_GL=disable`), and
/// WebKit's UI process opens an EGL display it then does not draw with. For the latter,
/// libglvnd is made to find no EGL driver in this process: its driver list is read once,
/// at the first EGL call, made here with an empty list; the variable is then removed so
/// that WebKit's web process (which needs EGL, it aborts without) starts with the normal
/// list. Only called when the shell itself turned compositing off, before any thread.
fn keep_gl_out_of_the_shell() {
    #[cfg(target_os = "linux")]
    {
        const VENDORS: &str = "__EGL_VENDOR_LIBRARY_FILENAMES";
        if std::env::var_os("GDK_GL").is_none() {
            // SAFETY: called first in `main`, before any other thread exists.
            unsafe { std::env::set_var("GDK_GL", "disable") };
        }
        if std::env::var_os(VENDORS).is_some() {
            return;
        }
        // SAFETY: as above; and the calls below are plain C calls on a library loaded
        // here (never unloaded) with a symbol of the documented signature.
        unsafe {
            std::env::set_var(VENDORS, "/nonexistent");
            let lib = libc::dlopen(c"libEGL.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
            if !lib.is_null() {
                let sym = libc::dlsym(lib, c"eglQueryString".as_ptr());
                if !sym.is_null() {
                    type QueryString =
                        unsafe extern "C" fn(*mut libc::c_void, i32) -> *const libc::c_char;
                    let query: QueryString = std::mem::transmute(sym);
                    const EGL_EXTENSIONS: i32 = 0x3055;
                    query(std::ptr::null_mut(), EGL_EXTENSIONS);
                }
            }
            std::env::remove_var(VENDORS);
        }
    }
}
