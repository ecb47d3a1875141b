set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/fig3.png'
set title 'fig3'
set xlabel ''
set ylabel 'median Pearson (prefill vs decode counts)'
$d0 << EOD
"own request" 0.630762
"random pair" 0.28818
"same-domain pair" 0.436894
EOD
set style data histograms
set style fill solid 0.6
set boxwidth 0.8
plot $d0 using 2:xtic(1) title 'median_pearson'
