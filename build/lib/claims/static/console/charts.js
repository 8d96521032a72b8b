// Draws every <canvas data-chart="ID"> from the JSON in <script id="ID" type="application/json"> with Chart.js
// (vendored, scripts/vendor-js.sh): {type, labels, datasets: [{label, data}], x, y, stacked}. The numbers are
// also on the page as a table (the chart's text alternative); this only draws them.
(function () {
  const palette = ["#1a4fb5", "#8a1c1c", "#1d6b38", "#8a5a00", "#5b2a86", "#3d4f63"];
  function draw(canvas) {
    const spec = JSON.parse(document.getElementById(canvas.dataset.chart).textContent);
    const existing = Chart.getChart(canvas);
    if (existing) existing.destroy();
    new Chart(canvas, {
      type: spec.type || "bar",
      data: {
        labels: spec.labels,
        datasets: spec.datasets.map((d, i) => ({
          label: d.label, data: d.data, borderColor: d.color || palette[i % palette.length],
          backgroundColor: d.color || palette[i % palette.length], borderWidth: 2, pointRadius: 0, tension: 0.2,
        })),
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: {
          x: { stacked: !!spec.stacked, title: { display: true, text: spec.x } },
          y: { stacked: !!spec.stacked, beginAtZero: true, title: { display: true, text: spec.y } },
        },
      },
    });
  }
  function drawAll(root) { root.querySelectorAll("canvas[data-chart]").forEach(draw); }
  document.addEventListener("DOMContentLoaded", () => drawAll(document));
  // A live region's refresh (hx-swap="outerHTML") puts new elements in place of the old: htmx:load is fired on
  // the new content (htmx:afterSwap's target is the old element, already out of the page — the drain chart went
  // blank after the first refresh).
  document.addEventListener("htmx:load", (event) => drawAll(event.detail.elt || event.target));
})();
