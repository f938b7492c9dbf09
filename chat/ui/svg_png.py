"""Saving a chart drawn as SVG (chat/charts.py) as a PNG, in the browser: the image is the picture
on the page, pixel for pixel at twice its size, with no image library on the server."""

from __future__ import annotations


def save_png_js(container_id: str, file_name: str) -> str:
    """JavaScript for a button's `js=`: draw the SVG inside #container_id on a canvas and download it."""
    return f"""() => {{
  const svg = document.querySelector('#{container_id} svg');
  if (!svg) {{ alert('There is no chart to save yet.'); return; }}
  const width = svg.viewBox.baseVal.width, height = svg.viewBox.baseVal.height, scale = 2;
  const xml = new XMLSerializer().serializeToString(svg);
  const image = new Image();
  image.onload = () => {{
    const canvas = document.createElement('canvas');
    canvas.width = width * scale; canvas.height = height * scale;
    const context = canvas.getContext('2d');
    context.fillStyle = '#ffffff'; context.fillRect(0, 0, canvas.width, canvas.height);
    context.drawImage(image, 0, 0, canvas.width, canvas.height);
    canvas.toBlob((blob) => {{
      const link = document.createElement('a');
      link.href = URL.createObjectURL(blob); link.download = '{file_name}';
      document.body.appendChild(link); link.click(); link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    }}, 'image/png');
  }};
  image.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(xml);
}}"""
