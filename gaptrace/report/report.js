(function () {
  "use strict";
  var config = { displaylogo: false, responsive: true, typesetMath: false };
  Object.keys(FIGURES).forEach(function (id) {
    var el = document.getElementById(id);
    if (el && FIGURES[id].data.length) {
      Plotly.newPlot(el, FIGURES[id].data, FIGURES[id].layout, config);
    }
  });
})();
