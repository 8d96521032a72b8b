// A live region (htmx polls it) says how old it is: when no refresh has arrived for more than two intervals — the
// server is unreachable, the network is down — its "stale" mark shows, with the seconds since the last one. The
// browser's own clock measures it (from the region's arrival), so a skewed clock changes nothing.
(() => {
  const arrived = new WeakMap();
  const note = (root) => {
    const regions = root.matches && root.matches(".live-region") ? [root] : [];
    regions.push(...(root.querySelectorAll ? root.querySelectorAll(".live-region") : []));
    for (const region of regions) arrived.set(region, Date.now());
  };
  document.addEventListener("DOMContentLoaded", () => note(document));
  document.addEventListener("htmx:load", (event) => note(event.detail.elt || event.target));
  setInterval(() => {
    for (const region of document.querySelectorAll(".live-region")) {
      const mark = region.querySelector(".stale-mark");
      if (!mark) continue;
      const every = Number(region.dataset.refreshSeconds || 3);
      const age = (Date.now() - (arrived.get(region) || Date.now())) / 1000;
      const stale = age > 2 * every + 1;
      mark.hidden = !stale;
      if (stale) mark.querySelector(".stale-for").textContent = Math.round(age);
    }
  }, 1000);
})();
