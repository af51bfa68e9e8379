/* When a program's window appears and paints, for scripts/bench-desktop.sh. Started right
 * after the program, it prints three moments (ms since the epoch, CLOCK_REALTIME like
 * `date +%s%N`), one a line:
 *   1. the program's window is mapped (a top-level window whose _NET_WM_PID is PID);
 *   2. first paint: the window shows more than 20 colours (a blank or one-colour page
 *      does not count; one line of anti-aliased text does);
 *   3. quiet: when the window last changed before a quiet second ("visually complete":
 *      the chat is shown, not just the first frame), looking at most SETTLE_MS past the
 *      first paint. Changes of under 400 pixels do not count: the composer's blinking
 *      caret (about 2 x 17) would never let it be quiet.
 * Exits 1 if the window has not painted after TIMEOUT_MS.
 *
 * Why not `xdotool search --sync` and `import -window` in a loop: xdotool looks again only
 * every 0.5 s and each round of import and convert took about 0.3 s on a loaded machine,
 * so both moments were known only to within that, and a window of the run before (same
 * title, not yet destroyed) could be taken for the new one. Here the X server says when a
 * window is mapped (SubstructureNotify on the root) and when its contents change (the
 * Damage extension), and only then is the window read (one XGetImage, a few ms); a 50 ms
 * tick looks anyway, in case a change comes without an event.
 *
 * Build: cc -O2 -o paint-wait paint-wait.c -lX11 -lXdamage
 * Usage: paint-wait PID [TIMEOUT_MS [SETTLE_MS]]
 */
#include <X11/Xatom.h>
#include <X11/Xlib.h>
#include <X11/Xutil.h>
#include <X11/extensions/Xdamage.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int x_error(Display *d, XErrorEvent *e) {
  (void)d;
  (void)e;
  return 0; /* a window destroyed between two calls: it is looked for again next time */
}

/* The process that owns window W, from _NET_WM_PID (GTK sets it), or 0. */
static unsigned long window_pid(Display *d, Window w, Atom net_wm_pid) {
  Atom type;
  int format;
  unsigned long n, after, pid = 0;
  unsigned char *data = NULL;
  if (XGetWindowProperty(d, w, net_wm_pid, 0, 1, False, XA_CARDINAL, &type, &format, &n, &after, &data) == Success && data) {
    if (type == XA_CARDINAL && format == 32 && n == 1) pid = *(unsigned long *)data;
    XFree(data);
  }
  return pid;
}

/* PID's mapped top-level window, or 0. */
static Window find_window(Display *d, unsigned long pid, Atom net_wm_pid) {
  Window root_ret, parent, *children = NULL, found = 0;
  unsigned int n = 0;
  if (!XQueryTree(d, DefaultRootWindow(d), &root_ret, &parent, &children, &n)) return 0;
  for (unsigned int i = n; i-- > 0 && !found;) {
    XWindowAttributes a;
    if (window_pid(d, children[i], net_wm_pid) == pid && XGetWindowAttributes(d, children[i], &a) && a.map_state == IsViewable)
      found = children[i];
  }
  if (children) XFree(children);
  return found;
}

/* More than 20 distinct colours? The rule the script used with `convert -format %k`. */
static int painted(Display *d, Window w) {
  XWindowAttributes a;
  if (!XGetWindowAttributes(d, w, &a) || a.map_state != IsViewable) return 0;
  XImage *img = XGetImage(d, w, 0, 0, a.width, a.height, AllPlanes, ZPixmap);
  if (!img) return 0;
  unsigned long seen[21];
  int n = 0;
  for (int y = 0; y < img->height && n <= 20; y++) {
    for (int x = 0; x < img->width && n <= 20; x++) {
      unsigned long p = XGetPixel(img, x, y) & 0xffffff;
      int i = 0;
      while (i < n && seen[i] != p) i++;
      if (i == n) seen[n++] = p;
    }
  }
  XDestroyImage(img);
  return n > 20;
}

/* Waits for an event or 50 ms; returns whether a damage event of at least MIN_AREA came. */
static int wait_events(Display *d, int damage_event, long min_area) {
  struct pollfd pfd = {.fd = ConnectionNumber(d), .events = POLLIN};
  int seen = 0;
  if (XPending(d) == 0) poll(&pfd, 1, 50);
  while (XPending(d)) {
    XEvent e;
    XNextEvent(d, &e);
    if (e.type == damage_event) {
      XDamageNotifyEvent *n = (XDamageNotifyEvent *)&e;
      if ((long)n->area.width * n->area.height >= min_area) seen = 1;
    }
  }
  return seen;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: paint-wait PID [TIMEOUT_MS [SETTLE_MS]]\n");
    return 2;
  }
  unsigned long pid = strtoul(argv[1], NULL, 10);
  long long deadline = now_ms() + (argc > 2 ? atoll(argv[2]) : 60000);
  long long settle = argc > 3 ? atoll(argv[3]) : 10000;
  /* A busy Xvfb now and then refuses a connection: try again for 2 s. */
  Display *d = NULL;
  for (int i = 0; i < 20 && !(d = XOpenDisplay(NULL)); i++) poll(NULL, 0, 100);
  if (!d) {
    fprintf(stderr, "paint-wait: cannot open the display\n");
    return 2;
  }
  XSetErrorHandler(x_error);
  Atom net_wm_pid = XInternAtom(d, "_NET_WM_PID", False);
  int damage_base, err_base;
  if (!XDamageQueryExtension(d, &damage_base, &err_base)) {
    fprintf(stderr, "paint-wait: no Damage extension\n");
    return 2;
  }
  int damage_event = damage_base + XDamageNotify;
  /* Map events of top-level windows wake the loop below. */
  XSelectInput(d, DefaultRootWindow(d), SubstructureNotifyMask);
  XSync(d, False);
  Window w = 0;
  while (!(w = find_window(d, pid, net_wm_pid))) {
    if (now_ms() > deadline) return 1;
    wait_events(d, damage_event, 0);
  }
  printf("%lld\n", now_ms());
  fflush(stdout);
  /* Every change as a rectangle, to tell the caret from the page later. */
  XDamageCreate(d, w, XDamageReportRawRectangles);
  XSync(d, False);
  while (!painted(d, w)) {
    if (now_ms() > deadline) return 1;
    wait_events(d, damage_event, 0);
  }
  long long first = now_ms(), last = first;
  printf("%lld\n", first);
  fflush(stdout);
  while (now_ms() - last < 1000 && now_ms() - first < settle) {
    if (wait_events(d, damage_event, 400)) last = now_ms();
  }
  printf("%lld\n", last);
  return 0;
}
